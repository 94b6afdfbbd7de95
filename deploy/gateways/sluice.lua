-- sluice as HAProxy's rate limiter: an `http-request lua.sluice` action
-- that asks sluice's forward-auth about the request (see
-- deploy/gateways/haproxy.cfg).
--
-- sluice is asked with a request built here, from scratch: the tenant is
-- `txn.tenant` (haproxy.cfg sets it from the identity it authenticated),
-- the method and URI are HAProxy's own view of the request, and the only
-- header of the client's that goes through is Idempotency-Key (the
-- duplicate guard's fingerprint, the client's to choose; sent as many
-- times as the client sent it, so that sluice refuses a repeated one).
--
-- sluice's refusals (any 4xx: 429, 409, 400, 413) are answered to the
-- client here, with sluice's status, fields and body; the request never
-- reaches the app. An allowed answer leaves the RateLimit fields in
-- txn.ratelimit and txn.ratelimit_policy for haproxy.cfg to add to the
-- app's answer, and puts the attempt it holds on count_if rules on the
-- request as Sluice-Attempt (a client's own is always removed). When sluice is unreachable, does not answer within 1 s or
-- answers 5xx, txn.sluice_failed is set and haproxy.cfg decides (it fails
-- open unless told otherwise). sluice's address is below.
local SLUICE = "127.0.0.1:8080"
local SLUICE_HOST, SLUICE_PORT = string.match(SLUICE, "^(.*):(%d+)$")
-- sluice's fields a refusal carries to the client.
local RELAYED = { "content-type", "retry-after", "ratelimit", "ratelimit-policy" }

-- A header value as it may be sent: no control characters.
local function clean(value)
  return (string.gsub(value or "", "%c", ""))
end

-- sluice's answer: status, headers (lower-case names) and body, or nil
-- when it could not be had within the socket's timeout.
local function ask(request)
  local sock = core.tcp()
  sock:settimeout(1)
  if not sock:connect(SLUICE_HOST, SLUICE_PORT) then
    return nil
  end
  sock:send(request)
  local status_line = sock:receive("*l")
  local status = status_line and tonumber(string.match(status_line, "^HTTP/%d%.%d (%d+)"))
  if not status then
    sock:close()
    return nil
  end
  local headers = {}
  while true do
    local line = sock:receive("*l")
    if not line then
      sock:close()
      return nil
    end
    if line == "" then
      break
    end
    local name, value = string.match(line, "^([^:]+):%s*(.-)%s*$")
    if name then
      headers[string.lower(name)] = value
    end
  end
  local length = tonumber(headers["content-length"] or "0") or 0
  local body = ""
  if length > 0 then
    body = sock:receive(length) or ""
  end
  sock:close()
  return status, headers, body
end

core.register_action("sluice", { "http-req" }, function(txn)
  txn:set_var("txn.sluice_failed", false)
  -- The attempt the app concludes is sluice's, never the client's.
  txn.http:req_del_header("sluice-attempt")
  local request = "GET /v1/forward-auth HTTP/1.1\r\nHost: sluice\r\nConnection: close\r\n"
    .. "X-Tenant: " .. clean(txn:get_var("txn.tenant")) .. "\r\n"
    .. "X-Forwarded-Method: " .. clean(txn.sf:method()) .. "\r\n"
    .. "X-Forwarded-Uri: " .. clean(txn.sf:url()) .. "\r\n"
  -- HAProxy lists a header's values from index 0.
  local keys = txn.http:req_get_headers()["idempotency-key"] or {}
  for i = 0, #keys do
    if keys[i] then
      request = request .. "Idempotency-Key: " .. clean(keys[i]) .. "\r\n"
    end
  end
  local status, headers, body = ask(request .. "\r\n")
  if not status or status >= 500 then
    txn:set_var("txn.sluice_failed", true)
    return
  end
  if status >= 400 then
    local relayed = {}
    for _, name in ipairs(RELAYED) do
      if headers[name] then
        relayed[name] = { headers[name] }
      end
    end
    txn:done(txn:reply({ status = status, headers = relayed, body = body }))
    return
  end
  txn:set_var("txn.ratelimit", headers["ratelimit"] or "")
  txn:set_var("txn.ratelimit_policy", headers["ratelimit-policy"] or "")
  -- The attempt sluice holds on count_if rules, for the app to conclude.
  if headers["sluice-attempt"] then
    txn.http:req_set_header("Sluice-Attempt", clean(headers["sluice-attempt"]))
  end
end)
