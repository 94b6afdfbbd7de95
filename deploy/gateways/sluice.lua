-- sluice as HAProxy's rate limiter: an `http-request lua.sluice` action
-- that asks sluice's forward-auth about the request and leaves the answer
-- in variables for haproxy.cfg to act on (see deploy/gateways/haproxy.cfg).
--
--   txn.sluice_status   sluice's status (200, 429, …; 0 when unreachable)
--   txn.ratelimit, txn.ratelimit_policy, txn.retry_after, txn.sluice_body
--
-- The tenant is `txn.tenant`, which haproxy.cfg sets from the identity it
-- authenticated. sluice's address is below.
local SLUICE = "127.0.0.1:8080"
local SLUICE_HOST, SLUICE_PORT = string.match(SLUICE, "^(.*):(%d+)$")

-- A header value as it may be sent: no control characters.
local function clean(value)
  return (string.gsub(value or "", "%c", ""))
end

core.register_action("sluice", { "http-req" }, function(txn)
  txn:set_var("txn.sluice_status", 0)
  local sock = core.tcp()
  sock:settimeout(1)
  if not sock:connect(SLUICE_HOST, SLUICE_PORT) then
    return
  end
  sock:send("GET /v1/forward-auth HTTP/1.1\r\nHost: sluice\r\nConnection: close\r\n"
    .. "X-Tenant: " .. clean(txn:get_var("txn.tenant")) .. "\r\n"
    .. "X-Forwarded-Method: " .. clean(txn.sf:method()) .. "\r\n"
    .. "X-Forwarded-Uri: " .. clean(txn.sf:url()) .. "\r\n\r\n")
  local status_line = sock:receive("*l")
  local status = status_line and tonumber(string.match(status_line, "^HTTP/%d%.%d (%d+)"))
  if not status then
    sock:close()
    return
  end
  local headers = {}
  while true do
    local line = sock:receive("*l")
    if not line or line == "" then
      break
    end
    local name, value = string.match(line, "^([^:]+):%s*(.-)%s*$")
    if name then
      headers[string.lower(name)] = value
    end
  end
  local length = tonumber(headers["content-length"] or "0") or 0
  local body = length > 0 and sock:receive(length) or ""
  sock:close()
  txn:set_var("txn.sluice_status", status)
  txn:set_var("txn.ratelimit", headers["ratelimit"] or "")
  txn:set_var("txn.ratelimit_policy", headers["ratelimit-policy"] or "")
  txn:set_var("txn.retry_after", headers["retry-after"] or "")
  txn:set_var("txn.sluice_body", body or "")
end)
