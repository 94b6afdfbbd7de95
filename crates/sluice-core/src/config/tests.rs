use super::*;
use crate::rule::Algorithm;

const GOOD: &str = r#"
server:
  http: 127.0.0.1:9090
storage:
  backend: memory
  timeout: 20ms
default_plan: free
plans:
  free:
    tenant:
      - { algorithm: gcra, limit: 100, per: 1m }
    routes:
      "POST /v1/invoices":
        - { algorithm: sliding_log, limit: 5, per: 1s }
      "*":
        - { algorithm: token_bucket, limit: 20, per: 1s, burst: 50 }
  pro:
    tenant:
      - { algorithm: token_bucket, limit: 100, per: 1s, burst: 500 }
    subject:
      "*":
        - { algorithm: gcra, limit: 10, per: 1s }
tenants:
  acme-corp: { plan: pro }
  globex: { plan: pro, shards: 16 }
global:
  "POST /v1/invoices":
    - { algorithm: gcra, limit: 10000, per: 1s }
"#;

/// The errors of a bad file, as `line:column: message`.
fn errors(yaml: &str) -> Vec<String> {
    Config::from_yaml(yaml, "bad.yaml")
        .expect_err("config should be refused")
        .iter()
        .map(|e| {
            assert_eq!(e.origin, "bad.yaml");
            format!("{}:{}: {}", e.line, e.column, e.message)
        })
        .collect()
}

pub(super) fn single_error(yaml: &str) -> String {
    let all = errors(yaml);
    assert_eq!(all.len(), 1, "expected one error, got {all:#?}");
    all.into_iter().next().unwrap()
}

#[test]
fn parses_the_spec_example() {
    let config = Config::from_yaml(GOOD, "good.yaml").unwrap();
    assert_eq!(config.server.http.to_string(), "127.0.0.1:9090");
    assert_eq!(config.server.grpc.to_string(), defaults::GRPC);
    assert_eq!(config.storage.timeout_ms, 20);
    assert_eq!(config.storage.on_error, OnError::Local);
    assert_eq!(config.limits.default_plan, "free");
    assert_eq!(config.limits.plans.len(), 2);
    let free = &config.limits.plans[0];
    assert_eq!(free.name, "free");
    assert_eq!(free.tenant[0].name, "tenant-0");
    assert_eq!(free.tenant[0].rule.algorithm(), Algorithm::Gcra);
    assert_eq!(free.tenant[0].rule.period_ms(), 60_000);
    let globex = config
        .limits
        .tenants
        .iter()
        .find(|t| t.id == "globex")
        .unwrap();
    assert_eq!(globex.shards, 16);
    assert_eq!(config.limits.global[0].rules[0].name, "global-0");
}

#[test]
fn the_shipped_example_is_valid() {
    let text = include_str!("../../../../examples/sluice.yaml");
    Config::from_yaml(text, "examples/sluice.yaml").unwrap();
}

#[test]
fn unknown_algorithm_lists_the_allowed_ones() {
    let e = single_error(
        "default_plan: p\nplans:\n  p:\n    tenant:\n      - { algorithm: leaky, limit: 1, per: 1s }\n",
    );
    assert!(e.starts_with("5:22: unknown `algorithm` `leaky`"), "{e}");
    assert!(
        e.contains("gcra, token_bucket, sliding_log, sliding_window, fixed_window"),
        "{e}"
    );
}

#[test]
fn burst_on_a_window_algorithm_is_refused_at_the_burst() {
    let e = single_error(
        "default_plan: p\nplans:\n  p:\n    tenant:\n      - { algorithm: fixed_window, limit: 1, per: 1s, burst: 5 }\n",
    );
    assert!(e.starts_with("5:62:"), "{e}");
    assert!(e.contains("only for gcra and token_bucket"), "{e}");
}

#[test]
fn zero_limit_and_bad_duration_are_each_reported() {
    let all = errors(
        "default_plan: p\nplans:\n  p:\n    tenant:\n      - { limit: 0, per: 1s }\n      - { limit: 5, per: 1 sec }\n",
    );
    assert_eq!(all.len(), 2, "{all:#?}");
    assert!(
        all[0].starts_with("5:18:") && all[0].contains("`limit` must be a whole number from 1"),
        "{}",
        all[0]
    );
    assert!(
        all[1].starts_with("6:26:") && all[1].contains("`per`: `1 sec` is not a duration"),
        "{}",
        all[1]
    );
}

#[test]
fn unknown_plans_name_the_defined_ones() {
    let all = errors(
        "default_plan: gold\nplans:\n  free:\n    tenant: [{ limit: 1, per: 1s }]\ntenants:\n  acme: { plan: platinum }\n",
    );
    assert_eq!(all.len(), 2, "{all:#?}");
    assert!(
        all[0].starts_with("1:15:") && all[0].contains("unknown plan `gold`; defined plans: free")
    );
    assert!(
        all[1].starts_with("6:17:") && all[1].contains("tenant `acme` has unknown plan `platinum`")
    );
}

#[test]
fn missing_default_plan_is_an_error() {
    let e = single_error("plans:\n  free:\n    tenant: [{ limit: 1, per: 1s }]\n");
    assert!(e.contains("`default_plan` is missing"), "{e}");
}

#[test]
fn sliding_log_above_its_cap_points_to_sliding_window() {
    let e = single_error(
        "default_plan: p\nplans:\n  p:\n    tenant:\n      - { algorithm: sliding_log, limit: 50000, per: 1m }\n",
    );
    assert!(
        e.contains("capped at 10000") && e.contains("use sliding_window"),
        "{e}"
    );
}

#[test]
fn duplicate_keys_are_errors() {
    let e = single_error(
        "default_plan: p\nplans:\n  p:\n    tenant: [{ limit: 1, per: 1s }]\n  p:\n    tenant: [{ limit: 2, per: 1s }]\n",
    );
    assert_eq!(
        e,
        "5:3: `p` is given twice in one mapping: give each key once"
    );
}

#[test]
fn malformed_yaml_has_a_location() {
    let e = single_error("default_plan: p\nplans: [\n");
    assert!(!e.starts_with("0:"), "{e}");
}

#[test]
fn unknown_fields_are_errors() {
    let e = single_error(
        "default_plan: p\nplans:\n  p:\n    tenant: [{ limit: 1, per: 1s, brust: 4 }]\n",
    );
    assert!(e.contains("brust"), "{e}");
}

#[test]
fn display_is_file_line_column() {
    let err = Config::from_yaml(
        "default_plan: p\nplans:\n  p:\n    tenant: [{ limit: -1, per: 1s }]\n",
        "x.yaml",
    )
    .unwrap_err();
    assert!(err.to_string().starts_with("x.yaml:4:23: `limit`"), "{err}");
}

#[test]
fn storage_and_keys_are_validated() {
    let all = errors(
        "storage:\n  backend: redis\n  timeout: 1h\n  on_error: maybe\nkeys:\n  prefix: 'no spaces'\n  pepper_env: A\n  pepper_file: /x\ndefault_plan: p\nplans:\n  p: {}\n",
    );
    let text = all.join("\n");
    assert!(text.contains("needs `storage.url`"), "{text}");
    assert!(
        text.contains("`storage.timeout` must be from 1ms to 10s"),
        "{text}"
    );
    assert!(text.contains("allowed: local, allow, deny"), "{text}");
    assert!(text.contains("`keys.prefix`"), "{text}");
    assert!(
        text.contains("either `keys.pepper_env` or `keys.pepper_file`"),
        "{text}"
    );
}

#[test]
fn redis_url_errors_never_echo_the_url() {
    let e = single_error(
        "storage:\n  backend: redis\n  url: http://user:hunter2@host\ndefault_plan: p\nplans:\n  p: {}\n",
    );
    assert!(!e.contains("hunter2"), "{e}");
    assert!(e.contains("redis://"), "{e}");
}

#[test]
fn star_only_ends_a_pattern() {
    let e = single_error(
        "default_plan: p\nplans:\n  p:\n    routes:\n      \"GET /*/x\": [{ limit: 1, per: 1s }]\n",
    );
    assert!(e.contains("`*` may only end a pattern"), "{e}");
}

#[test]
fn two_spellings_of_one_route_are_refused_not_one_silently_dropped() {
    // Requests are normalised before they are matched, so these pairs are
    // one route each: only one list of each pair could ever apply.
    for (first, second) in [
        ("GET /a/b", "get /a/b/"),
        ("GET /a/b", "GET /a/%62"),
        ("POST /v1/*", "POST //v1/*"),
    ] {
        for table in ["routes", "subject"] {
            let e = single_error(&format!(
                "default_plan: p\nplans:\n  p:\n    {table}:\n      \"{first}\": [{{ name: one, limit: 1, per: 1s }}]\n      \"{second}\": [{{ name: two, limit: 2, per: 1s }}]\n"
            ));
            assert!(e.contains("is the same route as"), "{e}");
            assert!(e.contains(first) && e.contains(second), "{e}");
        }
        let e = single_error(&format!(
            "default_plan: p\nplans:\n  p: {{}}\nglobal:\n  \"{first}\": [{{ limit: 1, per: 1s }}]\n  \"{second}\": [{{ limit: 2, per: 1s }}]\n"
        ));
        assert!(e.contains("is the same route as"), "{e}");
        let e = single_error(&format!(
            "default_plan: p\nplans:\n  p:\n    dedupe:\n      \"{first}\": {{ window: 5s }}\n      \"{second}\": {{ window: 9s }}\n"
        ));
        assert!(e.contains("is the same route as"), "{e}");
    }
    // A prefix and the exact route it starts with are not the same.
    Config::from_yaml(
        "default_plan: p\nplans:\n  p:\n    routes:\n      \"GET /a/*\": [{ limit: 1, per: 1s }]\n      \"GET /a\": [{ limit: 1, per: 1s }]\n",
        "ok.yaml",
    )
    .unwrap();
}

#[test]
fn names_must_tell_scopes_apart() {
    let e = single_error(
        "default_plan: p\nplans:\n  p:\n    tenant: [{ name: x, limit: 1, per: 1s }]\n    routes:\n      \"*\": [{ name: x, limit: 1, per: 1s }]\n",
    );
    assert!(
        e.contains("`x` is used by both tenant and route rules"),
        "{e}"
    );
}

#[test]
fn tls_ca_file_needs_rediss_urls() {
    let e = single_error(
        "storage:\n  backend: redis\n  url: redis://127.0.0.1:6379\n  tls_ca_file: /etc/ca.pem\ndefault_plan: p\nplans:\n  p: {}\n",
    );
    assert!(
        e.starts_with("4:16:") && e.contains("use rediss:// URLs"),
        "{e}"
    );
    let ok = Config::from_yaml(
        "storage:\n  backend: redis\n  url: rediss://127.0.0.1:6380\n  tls_ca_file: /etc/ca.pem\ndefault_plan: p\nplans:\n  p: {}\n",
        "ok.yaml",
    )
    .unwrap();
    assert_eq!(
        ok.storage.tls_ca_file.as_deref(),
        Some(std::path::Path::new("/etc/ca.pem"))
    );
}

#[test]
fn redis_cluster_takes_seed_nodes_and_global_shards() {
    let config = Config::from_yaml(
        "storage:\n  backend: redis-cluster\n  nodes: [redis://127.0.0.1:7000, redis://127.0.0.1:7001]\ndefault_plan: p\nplans:\n  p: {}\n",
        "ok.yaml",
    )
    .unwrap();
    assert_eq!(
        config.storage.backend,
        Backend::RedisCluster {
            nodes: vec![
                "redis://127.0.0.1:7000".into(),
                "redis://127.0.0.1:7001".into()
            ],
            global_shards: 16,
        }
    );
    let e = single_error(
        "storage:\n  backend: redis-cluster\n  nodes: [redis://a:1]\n  global_shards: 0\ndefault_plan: p\nplans:\n  p: {}\n",
    );
    assert!(
        e.starts_with("4:18:")
            && e.contains("`storage.global_shards` must be from 1 to 1024, got 0"),
        "{e}"
    );
    let e = single_error(
        "storage:\n  backend: redis\n  url: redis://a:1\n  global_shards: 4\ndefault_plan: p\nplans:\n  p: {}\n",
    );
    assert!(e.contains("only for `backend: redis-cluster`"), "{e}");
    let e = single_error("storage:\n  backend: redis-cluster\ndefault_plan: p\nplans:\n  p: {}\n");
    assert!(e.contains("needs `storage.nodes`"), "{e}");
}

#[test]
fn pepper_rotation_is_refused_on_redis_cluster() {
    let e = single_error(
        "storage:\n  backend: redis-cluster\n  nodes: [redis://a:1]\nkeys:\n  pepper_env: P\n  previous_pepper_env: OLD\ndefault_plan: p\nplans:\n  p: {}\n",
    );
    assert!(
        e.starts_with("6:24:") && e.contains("not supported with `backend: redis-cluster`"),
        "{e}"
    );
}

#[test]
fn a_value_of_the_wrong_type_names_its_field() {
    let cases = [
        (
            "tenant: [{ limit: 1.5, per: 1s }]",
            "4:23: `limit` must be a whole number",
        ),
        (
            "tenant: [{ limit: 5, per: 1s, shadow: 7 }]",
            "4:43: `shadow` must be true or false",
        ),
        (
            "tenant: [{ limit: 5, per: [1s] }]",
            "4:31: `per` must be one value (text), not a list or a map",
        ),
    ];
    for (tenant, expected) in cases {
        let e = single_error(&format!("default_plan: p\nplans:\n  p:\n    {tenant}\n"));
        assert_eq!(e, expected);
    }
    let e = single_error("near_limit: high\ndefault_plan: p\nplans:\n  p: {}\n");
    assert_eq!(e, "1:13: `near_limit` must be a number (e.g. 0.8)");
    // A huge value is shown short.
    let e = single_error("near_limit: 1e300\ndefault_plan: p\nplans:\n  p: {}\n");
    assert!(e.ends_with("got 1e300"), "{e}");
    // A URL in the wrong shape is not echoed: it may carry a password.
    let e = single_error(
        "storage:\n  backend: redis\n  url: [redis://u:hunter2@h]\ndefault_plan: p\nplans:\n  p: {}\n",
    );
    assert!(
        e.contains("`url` must be one value") && !e.contains("hunter2"),
        "{e}"
    );
}

#[test]
fn the_fields_added_for_limits_dedupe_and_client_ips_name_themselves_and_their_ranges() {
    let plan = "default_plan: p\nplans:\n  p:\n    tenant: [{ limit: 1, per: 1s }]\n";
    let cases = [
        (
            format!("server:\n  limits: {{ max_connections: 0 }}\n{plan}"),
            "`server.limits.max_connections` must be from 1 to 1000000, got 0",
        ),
        (
            format!("server:\n  limits: {{ header_timeout: 11m }}\n{plan}"),
            "`server.limits.header_timeout` must be from 100ms to 10m",
        ),
        (
            format!("server:\n  limits: {{ grpc_max_message_bytes: 10 }}\n{plan}"),
            "`server.limits.grpc_max_message_bytes` must be from 1024 to 16777216",
        ),
        (
            format!("server:\n  forward_auth: {{ subject_from: ip }}\n{plan}"),
            "`server.forward_auth.subject_from` must be `header` or `client_ip`, got `ip`",
        ),
        (
            format!("storage: {{ max_entries: 1000, max_entries_per_tenant: 1001 }}\n{plan}"),
            "`storage.max_entries_per_tenant` must be from 1 to `storage.max_entries` (1000), got 1001",
        ),
        (
            format!("server:\n  forward_auth: {{ client_ip_header: x-real-ip }}\n{plan}"),
            "`server.forward_auth.client_ip_header` must be `x-forwarded-for` or `forwarded`, got `x-real-ip`",
        ),
        (
            format!("server:\n  forward_auth: {{ trusted_proxies: [10.0.0.0/33] }}\n{plan}"),
            "`server.forward_auth.trusted_proxies` takes addresses or CIDRs",
        ),
        (
            format!("server:\n  metrics: {{ path: /m }}\n{plan}"),
            "`server.metrics` needs `listen`",
        ),
        (
            format!("server:\n  metrics: {{ listen: 9090 }}\n{plan}"),
            "`server.metrics.listen` must be an IP address and port",
        ),
        (
            format!(
                "server:\n  metrics: {{ listen: \"0.0.0.0:9090\", path: \"metrics?x\" }}\n{plan}"
            ),
            "`server.metrics.path` must be a path such as /metrics",
        ),
        (
            format!("envoy:\n  files: some\n{plan}"),
            "`envoy.files` must be `yaml` or `all`, got `some`",
        ),
        (
            format!("{plan}    dedupe:\n      \"POST /x\": {{ window: 2d }}\n"),
            "`dedupe.window` must be from 10ms to 1d",
        ),
        (
            format!("{plan}    dedupe:\n      \"POST /x\": {{}}\n"),
            "`dedupe` entries need a `window`",
        ),
        (
            "default_plan: p\nplans:\n  p:\n    tenant: [{ algorithm: concurrency, limit: 2, per: 1s }]\n".to_owned(),
            "`per` is not for `algorithm: concurrency`",
        ),
        (
            "default_plan: p\nplans:\n  p:\n    tenant: [{ algorithm: concurrency, limit: 2 }]\n".to_owned(),
            "a concurrency rule needs `lease`",
        ),
        (
            "default_plan: p\nplans:\n  p:\n    tenant: [{ algorithm: concurrency, limit: 2, lease: 2d }]\n".to_owned(),
            "`lease` must be from 1ms to 1d, got 2d",
        ),
        (
            "default_plan: p\nplans:\n  p:\n    tenant: [{ algorithm: concurrency, limit: 10001, lease: 1s }]\n".to_owned(),
            "`limit` is capped at 10000 (got 10001)",
        ),
        (
            "default_plan: p\nplans:\n  p:\n    tenant: [{ algorithm: gcra, limit: 2, per: 1s, lease: 1s }]\n".to_owned(),
            "`lease` is only for `algorithm: concurrency`",
        ),
    ];
    for (yaml, expected) in cases {
        let found = errors(&yaml);
        assert!(
            found.iter().any(|e| e.contains(expected)),
            "{expected:?} not in {found:?}"
        );
    }
    // At the bounds, accepted.
    let edge = format!(
        "server:\n  limits: {{ max_connections: 1000000, header_timeout: 10m, grpc_max_message_bytes: 16777216 }}\n  forward_auth: {{ subject_from: client_ip, trusted_proxies: [\"::1\", 10.0.0.0/8] }}\n{plan}    dedupe:\n      \"POST /x\": {{ window: 1d }}\n"
    );
    let config = Config::from_yaml(&edge, "edge.yaml").unwrap();
    assert_eq!(config.server.limits.max_connections, 1_000_000);
    assert_eq!(config.server.forward_auth.trusted_proxies.len(), 2);
    assert_eq!(config.limits.plans[0].dedupe.len(), 1);
}

#[test]
fn a_list_holds_at_most_the_bound_of_rules() {
    let list = |n: usize| {
        (0..n)
            .map(|i| format!("      - {{ name: r{i}, limit: {}, per: 1s }}\n", i + 1))
            .collect::<String>()
    };
    let plan = |scope: &str, n: usize| match scope {
        "tenant" => format!("default_plan: p\nplans:\n  p:\n    tenant:\n{}", list(n)),
        _ => format!(
            "default_plan: p\nplans:\n  p:\n    {scope}:\n      \"GET /a\":\n{}",
            list(n).replace("      - ", "        - ")
        ),
    };
    for scope in ["tenant", "routes", "subject"] {
        Config::from_yaml(&plan(scope, MAX_RULES_PER_LIST), "ok.yaml").unwrap();
        let error = single_error(&plan(scope, MAX_RULES_PER_LIST + 1));
        assert!(
            error.contains(&format!("holds at most {MAX_RULES_PER_LIST} rules, got 65")),
            "{scope}: {error}"
        );
    }
    let valve = format!(
        "default_plan: p\nplans:\n  p: {{}}\nglobal:\n  \"*\":\n{}",
        list(MAX_RULES_PER_LIST + 1).replace("      - ", "    - ")
    );
    assert!(single_error(&valve).contains("`global` rules holds at most 64"));
}

/// A value of the wrong shape is named by its field, and what it takes is
/// said in the words of the file, not the parser's.
#[test]
fn a_list_or_map_of_the_wrong_shape_is_named() {
    for (yaml, said) in [
        (
            "default_plan: p\nplans:\n  p:\n    tenant: x\n",
            "4:13: `tenant` must be a list (`[a, b]`, or one `- ` item per line)",
        ),
        (
            "default_plan: p\nplans:\n  p:\n    routes: [1]\n",
            "4:13: `routes` must be a map (`key: value` pairs, or `{ key: value }`)",
        ),
        (
            "default_plan: p\nplans: []\n",
            "2:8: `plans` must be a map (`key: value` pairs, or `{ key: value }`)",
        ),
    ] {
        assert_eq!(single_error(yaml), said);
    }
}

const REGIONS: &str = r#"
storage:
  backend: redis
  url: "redis://redis-eu:6379"
  regions:
    self: eu
    weight: 2
    peers:
      us: { url: "redis://redis-us:6379" }
      ap: { url: "redis://redis-ap:6379", weight: 3 }
    sync_every: 100ms
default_plan: p
plans:
  p:
    tenant:
      - { name: minute, algorithm: fixed_window, limit: 100, per: 1m, aligned: true }
      - { name: rate, limit: 10, per: 1s, regions: local }
"#;

#[test]
fn storage_regions_parse_with_their_defaults_and_order() {
    let config = Config::from_yaml(REGIONS, "t.yaml").unwrap();
    let regions = config.storage.regions.expect("storage.regions");
    assert_eq!(regions.this, "eu");
    assert_eq!(
        (regions.sync_every_ms, regions.peer_timeout_ms),
        (100, 5_000)
    );
    assert_eq!(regions.in_order(), [("ap", 3), ("eu", 2), ("us", 1)]);
    let ap = regions.peers.iter().find(|p| p.name == "ap").unwrap();
    assert_eq!(
        (&ap.store, ap.weight),
        (&PeerStore::Redis("redis://redis-ap:6379".into()), 3)
    );
    // A region on Redis Cluster, and a peer on one.
    let yaml = REGIONS
        .replace(
            "backend: redis\n  url: \"redis://redis-eu:6379\"",
            "backend: redis-cluster\n  nodes: [\"redis://eu-1:7000\"]",
        )
        .replace(
            "us: { url: \"redis://redis-us:6379\" }",
            "us: { nodes: [\"redis://us-1:7000\", \"redis://us-2:7000\"] }",
        );
    let config = Config::from_yaml(&yaml, "t.yaml").unwrap();
    let regions = config.storage.regions.expect("storage.regions");
    let us = regions.peers.iter().find(|p| p.name == "us").unwrap();
    assert_eq!(
        us.store,
        PeerStore::Cluster(vec!["redis://us-1:7000".into(), "redis://us-2:7000".into()])
    );
    let plan = config.limits.plans.iter().find(|p| p.name == "p").unwrap();
    let rules = &plan.tenant;
    assert_eq!(rules[0].regions, None);
    assert_eq!(rules[1].regions, Some(RegionScope::Local));
    assert_eq!(
        RegionScope::default_for(crate::Scope::Tenant, &rules[0].rule),
        RegionScope::Shared
    );
    // A gcra (the default algorithm) is shared by default too.
    assert_eq!(
        RegionScope::default_for(crate::Scope::Tenant, &rules[1].rule),
        RegionScope::Shared
    );
}

#[test]
fn storage_regions_errors_name_the_field_and_what_is_allowed() {
    let cases = [
        (
            "backend: redis",
            "backend: memory",
            "the memory store has no peers",
        ),
        (
            "self: eu",
            "self: EU",
            "`storage.regions.self` must be 1 to 32 lowercase",
        ),
        (
            "self: eu\n    weight: 2",
            "weight: 2",
            "`storage.regions` needs `self`",
        ),
        (
            "weight: 2",
            "weight: 0",
            "`storage.regions.weight` must be from 1 to 1000, got 0",
        ),
        (
            "us: { url: \"redis://redis-us:6379\" }",
            "eu: { url: \"redis://x:1\" }",
            "`storage.regions.peers.eu` is this region",
        ),
        (
            "us: { url: \"redis://redis-us:6379\" }",
            "us: { url: \"http://x\" }",
            "`storage.regions.peers.us.url` must be a redis://",
        ),
        (
            "us: { url: \"redis://redis-us:6379\" }",
            "us: { weight: 1 }",
            "`storage.regions.peers.us` needs `url`",
        ),
        (
            "us: { url: \"redis://redis-us:6379\" }",
            "us: { nodes: [] }",
            "`storage.regions.peers.us.nodes` is empty",
        ),
        (
            "us: { url: \"redis://redis-us:6379\" }",
            "us: { nodes: [\"http://x\"] }",
            "`storage.regions.peers.us.nodes` must be a redis://",
        ),
        (
            "regions: local",
            "algorithm: sliding_log, regions: shared",
            "a sliding_log keeps each admission's time",
        ),
        (
            "regions: local }",
            "burst: 2 }",
            "`burst` 2 is too small to share across 3 regions",
        ),
        (
            "limit: 10, per: 1s, regions: local }",
            "limit: 2, per: 1s }",
            "`limit` 2 is too small to share across 3 regions by their weights",
        ),
        (
            "sync_every: 100ms",
            "sync_every: 5ms",
            "`storage.regions.sync_every` must be from 10ms to 1m, got 5ms",
        ),
        (
            "sync_every: 100ms",
            "sync_every: 1s\n    peer_timeout: 1s",
            "`storage.regions.peer_timeout` must be from 2s to 1h, got 1s",
        ),
        (
            ", aligned: true }",
            " }",
            "a shared fixed_window needs `aligned: true`",
        ),
        (
            "regions: local",
            "regions: everywhere",
            "unknown `regions` `everywhere`; allowed: shared",
        ),
    ];
    for (from, to, expected) in cases {
        let mut yaml = REGIONS.replacen(from, to, 1);
        if from == ", aligned: true }" {
            yaml = yaml.replacen("per: 1m }", "per: 1m, regions: shared }", 1);
        }
        let found = errors(&yaml);
        assert!(
            found.iter().any(|e| e.contains(expected)),
            "{to}: expected {expected:?} in {found:?}"
        );
    }
    let valve = "global:\n  \"*\": [{ name: db, limit: 100, per: 1s, regions: shared }]\n";
    let found = errors(&format!("{REGIONS}{valve}"));
    assert!(
        found
            .iter()
            .any(|e| e.contains("a valve protects each region's own downstream")),
        "{found:?}"
    );
}
