//! envoyproxy/ratelimit's configuration on the memory store, Redis and
//! Redis Cluster: its semantics, and its current configuration language.

use super::*;

/// The behaviours envoyproxy/ratelimit users rely on, checked on a running
/// service.
async fn envoyproxy_semantics(server: &Server) {
    let mut c = client(server).await;
    let one = |entries: &[(&str, &str)]| vec![descriptor(entries)];

    // A key without a value counts each value on its own.
    for _ in 0..3 {
        let r = ask(&mut c, "edge", one(&[("remote_address", "10.0.0.1")]), 0).await;
        assert_eq!(overall(&r), Code::Ok);
    }
    let r = ask(&mut c, "edge", one(&[("remote_address", "10.0.0.1")]), 0).await;
    assert_eq!(overall(&r), Code::OverLimit);
    let status = &r.statuses[0];
    assert_eq!(status.current_limit.as_ref().unwrap().requests_per_unit, 3);
    assert_eq!(status.limit_remaining, 0);
    // Whole seconds, rounded up, as envoyproxy/ratelimit reports them.
    let reset = status.duration_until_reset.as_ref().unwrap();
    assert!((1..=60).contains(&reset.seconds), "{reset:?}");
    assert_eq!(reset.nanos, 0);
    assert!(header(&r, "Retry-After").is_some());
    assert!(header(&r, "RateLimit").unwrap().contains(";r=0;"));
    assert!(
        header(&r, "RateLimit-Policy")
            .unwrap()
            .contains(";q=3;w=60")
    );
    let r = ask(&mut c, "edge", one(&[("remote_address", "10.0.0.2")]), 0).await;
    assert_eq!(overall(&r), Code::Ok);

    // Wildcard values, and an exact unlimited value that never counts.
    for _ in 0..5 {
        assert_eq!(
            overall(&ask(&mut c, "edge", one(&[("path", "/api/a")]), 0).await),
            Code::Ok
        );
    }
    assert_eq!(
        overall(&ask(&mut c, "edge", one(&[("path", "/api/b")]), 0).await),
        Code::Ok,
        "per value"
    );
    assert_eq!(
        overall(&ask(&mut c, "edge", one(&[("path", "/api/a")]), 0).await),
        Code::OverLimit
    );
    for _ in 0..10 {
        let r = ask(&mut c, "edge", one(&[("path", "/api/health")]), 0).await;
        assert_eq!(overall(&r), Code::Ok);
        assert_eq!(r.statuses[0].limit_remaining, u32::MAX, "unlimited");
        assert!(r.statuses[0].current_limit.is_none());
    }

    // requests_per_unit: 0 is always over.
    let r = ask(&mut c, "edge", one(&[("path", "/blocked")]), 0).await;
    assert_eq!(codes(&r), [Code::OverLimit]);
    assert_eq!(
        r.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        0
    );

    // Nested descriptors: the limit of the node the last entry reaches.
    let premium = [("tenant", "t1"), ("plan", "premium")];
    let r = ask(&mut c, "edge", one(&premium), 0).await;
    assert_eq!(
        r.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        10
    );
    assert_eq!(r.statuses[0].limit_remaining, 9);
    for entries in [
        &[("tenant", "t1")][..],
        &[("tenant", "t1"), ("plan", "basic")],
        &[("tenant", "t1"), ("plan", "premium"), ("x", "y")],
    ] {
        let r = ask(&mut c, "edge", one(entries), 0).await;
        assert_eq!(overall(&r), Code::Ok);
        assert!(
            r.statuses[0].current_limit.is_none(),
            "{entries:?} matches no limit"
        );
    }

    // `replaces`: with premium present, the api limit (5) does not apply.
    for _ in 0..7 {
        let r = ask(
            &mut c,
            "edge",
            vec![
                descriptor(&[("path", "/api/replaced")]),
                descriptor(&[("tenant", "t2"), ("plan", "premium")]),
            ],
            0,
        )
        .await;
        assert_eq!(codes(&r), [Code::Ok, Code::Ok]);
        assert!(r.statuses[0].current_limit.is_none());
    }

    // Shadow mode never denies.
    for _ in 0..3 {
        assert_eq!(
            overall(&ask(&mut c, "edge", one(&[("user", "u1")]), 0).await),
            Code::Ok
        );
    }

    // hits_addend, for the request and per descriptor.
    let r = ask(&mut c, "edge", one(&[("remote_address", "10.0.0.3")]), 3).await;
    assert_eq!((overall(&r), r.statuses[0].limit_remaining), (Code::Ok, 0));
    assert_eq!(
        overall(&ask(&mut c, "edge", one(&[("remote_address", "10.0.0.3")]), 0).await),
        Code::OverLimit
    );
    let mut heavy = descriptor(&[("bucket", "b1")]);
    heavy.hits_addend = Some(UInt64Value { value: 2 });
    let r = ask(&mut c, "edge", vec![heavy], 0).await;
    assert_eq!((overall(&r), r.statuses[0].limit_remaining), (Code::Ok, 0));
    assert_eq!(r.statuses[0].current_limit.as_ref().unwrap().name, "smooth");
    assert_eq!(
        overall(&ask(&mut c, "edge", one(&[("bucket", "b1")]), 0).await),
        Code::OverLimit
    );

    // A limit override from Envoy's route replaces the configured limit.
    let mut overridden = descriptor(&[("remote_address", "10.0.0.4")]);
    overridden.limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: 3, // HOUR
    });
    let r = ask(&mut c, "edge", vec![overridden.clone()], 0).await;
    assert_eq!(overall(&r), Code::Ok);
    assert_eq!(
        r.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        1
    );
    assert_eq!(
        overall(&ask(&mut c, "edge", vec![overridden], 0).await),
        Code::OverLimit
    );
    // Overrides of any size envoyproxy/ratelimit accepts are honoured:
    // 150000 per year, the largest uint32 per second.
    for (requests_per_unit, unit) in [(150_000u32, 6), (u32::MAX, 1)] {
        let mut big = descriptor(&[("remote_address", &format!("10.0.9.{unit}"))]);
        big.limit = Some(RateLimitOverride {
            requests_per_unit,
            unit,
        });
        let r = ask(&mut c, "edge", vec![big], 0).await;
        assert_eq!(overall(&r), Code::Ok, "{requests_per_unit} per unit {unit}");
        assert_eq!(r.statuses[0].limit_remaining, requests_per_unit - 1);
    }

    // Statuses come in request order, and a denied request consumes nothing
    // from any descriptor.
    let r = ask(
        &mut c,
        "edge",
        vec![
            descriptor(&[("remote_address", "10.0.0.5")]),
            descriptor(&[("path", "/blocked")]),
        ],
        0,
    )
    .await;
    assert_eq!(codes(&r), [Code::Ok, Code::OverLimit]);
    assert_eq!(overall(&r), Code::OverLimit);
    let r = ask(
        &mut c,
        "edge",
        vec![
            descriptor(&[("remote_address", "10.0.0.6")]),
            descriptor(&[("path", "/api/a")]),
        ],
        0,
    )
    .await;
    assert_eq!(codes(&r), [Code::Ok, Code::OverLimit]);
    for address in ["10.0.0.5", "10.0.0.6"] {
        for _ in 0..3 {
            let r = ask(&mut c, "edge", one(&[("remote_address", address)]), 0).await;
            assert_eq!(
                overall(&r),
                Code::Ok,
                "{address}: denied requests counted nothing"
            );
        }
    }

    // Unknown domains have no limits.
    let r = ask(
        &mut c,
        "elsewhere",
        one(&[("remote_address", "10.0.0.1")]),
        0,
    )
    .await;
    assert_eq!(codes(&r), [Code::Ok]);
}

#[tokio::test]
async fn envoyproxy_configuration_on_the_memory_store() {
    let mut server = start("", "memory");
    envoyproxy_semantics(&server).await;
    let metrics = || async {
        reqwest::get(format!("{}/metrics", server.base))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    };
    let count = common::metric_total;
    // A `requests_per_unit: 0` descriptor counts as denied, never allowed.
    let before = metrics().await;
    let mut c = client(&server).await;
    let r = ask(&mut c, "edge", vec![descriptor(&[("path", "/blocked")])], 0).await;
    assert_eq!(overall(&r), Code::OverLimit);
    let after = metrics().await;
    let denied = "sluice_decisions_total{outcome=\"denied\",reason=\"descriptor_limit\"";
    let allowed = "sluice_decisions_total{outcome=\"allowed\"";
    assert_eq!(count(&after, denied) - count(&before, denied), 1.0);
    assert_eq!(count(&after, allowed), count(&before, allowed));
    let metrics = after;
    let shadow = metrics
        .lines()
        .find(|l| l.starts_with("sluice_shadow_denials_total"))
        .unwrap();
    assert!(!shadow.ends_with(" 0"), "{shadow}");
    // envoyproxy/ratelimit's stats, under its statsd-to-Prometheus names,
    // labelled by the configured key, never by a request's value.
    let stat = |name: &str, labels: &str| {
        count(
            &metrics,
            &format!("ratelimit_service_rate_limit_{name}{{{labels}}}"),
        )
    };
    let remote = "domain=\"edge\",key1=\"remote_address\"";
    assert!(stat("total_hits", remote) >= 4.0, "{metrics}");
    assert!(stat("over_limit", remote) >= 1.0, "{metrics}");
    assert!(stat("within_limit", remote) >= 3.0, "{metrics}");
    assert!(stat("near_limit", remote) >= 1.0, "{metrics}");
    assert!(
        stat("shadow_mode", "domain=\"edge\",key1=\"user\"") >= 1.0,
        "{metrics}"
    );
    assert!(
        stat(
            "total_hits",
            "domain=\"edge\",key1=\"tenant\",key2=\"plan_premium\""
        ) >= 1.0,
        "{metrics}"
    );
    assert!(
        !metrics.contains("10.0.0.1"),
        "request values are never labels"
    );
    server.stop();
}

#[tokio::test]
async fn envoyproxy_configuration_on_redis() {
    let redis = RedisServer::start();
    let storage = redis_storage(&redis);
    let mut server = start(&storage, "redis");
    envoyproxy_semantics(&server).await;
    // The descriptors' buckets are in Redis, opaque.
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query(&mut redis.connection())
        .unwrap();
    assert!(keys.iter().any(|k| k.starts_with("sl:{")));
    assert!(
        keys.iter()
            .all(|k| !k.contains("10.0.0") && !k.contains("api"))
    );
    server.stop();
}

#[tokio::test]
async fn envoyproxy_configuration_on_redis_cluster() {
    // Descriptors have tags of their own, on different slots: the same
    // semantics (all descriptors all or nothing) hold across masters.
    let cluster = RedisCluster::start(3, 0);
    let storage = cluster_storage(&cluster);
    let mut server = start(&storage, "cluster");
    envoyproxy_semantics(&server).await;
    server.stop();
    let log = server.log.lock().unwrap().clone();
    assert!(
        !log.contains("CROSSSLOT") && !log.contains("failure policy"),
        "{log}"
    );
}

/// envoyproxy/ratelimit's current configuration language, as its own
/// tests exercise it: wildcards anywhere, share_threshold, quota_mode,
/// replaces of a blocking limit, and the keys that only shape stats.
const CURRENT_LANGUAGE: &str = r#"
domain: lang
descriptors:
  - key: path
    value: "/v1/*/invoices/*"
    rate_limit: { unit: hour, requests_per_unit: 1 }
  - key: file
    value: "*.pdf"
    share_threshold: true
    detailed_metric: true
    rate_limit: { unit: hour, requests_per_unit: 2 }
  - key: file
    value: "*.csv"
    value_to_metric: true
    metadata: { owner: { team: billing }, tags: [a, b] }
    rate_limit: { unit: hour, requests_per_unit: 1 }
  - key: quota_a
    quota_mode: true
    rate_limit: { unit: hour, requests_per_unit: 1 }
  - key: quota_b
    quota_mode: true
    rate_limit: { unit: hour, requests_per_unit: 1 }
  - key: closed
    rate_limit: { unit: second, requests_per_unit: 0, name: closed }
  - key: opener
    rate_limit: { unit: hour, requests_per_unit: 5, replaces: [{ name: closed }] }
"#;

async fn current_language(server: &Server) {
    let mut c = client(server).await;
    let one = |k: &str, v: &str| vec![descriptor(&[(k, v)])];
    // Matching: a `*` in the middle, and more than one.
    let r = ask(&mut c, "lang", one("path", "/v1/acme/invoices/7"), 0).await;
    assert_eq!((overall(&r), r.statuses[0].limit_remaining), (Code::Ok, 0));
    let r = ask(&mut c, "lang", one("path", "/v1/acme/invoices/8"), 0).await;
    assert_eq!(overall(&r), Code::Ok, "each value counts on its own");
    let r = ask(&mut c, "lang", one("path", "/v1/acme/bills/7"), 0).await;
    assert!(r.statuses[0].current_limit.is_none(), "no limit matched");
    // What Envoy may send is answered: an empty descriptor (no limit), a
    // long value, many descriptors.
    let r = ask(&mut c, "lang", vec![descriptor(&[])], 0).await;
    assert_eq!(codes(&r), [Code::Ok]);
    let long = format!("/v1/{}/invoices/1", "a".repeat(10_000));
    assert_eq!(
        overall(&ask(&mut c, "lang", one("path", &long), 0).await),
        Code::Ok
    );
    let many: Vec<_> = (0..200)
        .map(|i| descriptor(&[("k", &i.to_string())]))
        .collect();
    assert_eq!(ask(&mut c, "lang", many, 0).await.statuses.len(), 200);
    // `hits_addend: 0` checks without consuming.
    let check = |v: &str| {
        let mut d = descriptor(&[("path", v)]);
        d.hits_addend = Some(UInt64Value { value: 0 });
        vec![d]
    };
    for _ in 0..3 {
        let r = ask(&mut c, "lang", check("/v1/x/invoices/1"), 0).await;
        assert_eq!((overall(&r), r.statuses[0].limit_remaining), (Code::Ok, 1));
        assert_eq!(
            r.statuses[0]
                .current_limit
                .as_ref()
                .unwrap()
                .requests_per_unit,
            1
        );
    }
    let r = ask(&mut c, "lang", check("/v1/acme/invoices/7"), 0).await;
    assert_eq!(
        (overall(&r), r.statuses[0].limit_remaining),
        (Code::Ok, 0),
        "spent"
    );
    let r = ask(&mut c, "lang", one("path", "/v1/x/invoices/1"), 0).await;
    assert_eq!(overall(&r), Code::Ok, "the checks consumed nothing");
    // Counting: share_threshold puts every matched value in one bucket;
    // without it each value has its own.
    for (value, code) in [
        ("a.pdf", Code::Ok),
        ("b.pdf", Code::Ok),
        ("c.pdf", Code::OverLimit),
    ] {
        assert_eq!(
            overall(&ask(&mut c, "lang", one("file", value), 0).await),
            code,
            "{value}"
        );
    }
    for value in ["a.csv", "b.csv"] {
        assert_eq!(
            overall(&ask(&mut c, "lang", one("file", value), 0).await),
            Code::Ok,
            "{value}"
        );
    }
    // Quota mode: a quota descriptor over its limit says so, but the
    // request is over only when every quota descriptor is.
    let quotas = || {
        vec![
            descriptor(&[("quota_a", "x")]),
            descriptor(&[("quota_b", "x")]),
        ]
    };
    let r = ask(&mut c, "lang", vec![descriptor(&[("quota_a", "x")])], 0).await;
    assert_eq!(overall(&r), Code::Ok);
    let r = ask(&mut c, "lang", quotas(), 0).await;
    assert_eq!(codes(&r), [Code::OverLimit, Code::Ok]);
    assert_eq!(overall(&r), Code::Ok, "quota_b still had room");
    let r = ask(&mut c, "lang", quotas(), 0).await;
    assert_eq!(codes(&r), [Code::OverLimit, Code::OverLimit]);
    assert_eq!(
        overall(&r),
        Code::OverLimit,
        "every quota descriptor is over"
    );
    // Replaces: a limit that replaces a blocking one lifts the block.
    let r = ask(&mut c, "lang", one("closed", "x"), 0).await;
    assert_eq!(overall(&r), Code::OverLimit);
    let r = ask(
        &mut c,
        "lang",
        vec![
            descriptor(&[("closed", "x")]),
            descriptor(&[("opener", "x")]),
        ],
        0,
    )
    .await;
    assert_eq!(codes(&r), [Code::Ok, Code::Ok]);
    assert_eq!(r.statuses[1].limit_remaining, 4);
    // Stats name request values only where the file asks: value_to_metric
    // names each csv; share_threshold keeps the pdf pattern even though
    // detailed_metric is set; otherwise the configured key. (A `.` splits
    // labels, as upstream's statsd mapping splits them.)
    let metrics = common::get_text(&reqwest::Client::new(), server, "/metrics").await;
    let hits = |labels: &str| {
        common::metric_total(
            &metrics,
            &format!("ratelimit_service_rate_limit_total_hits{{domain=\"lang\",{labels}}}"),
        )
    };
    assert_eq!(hits("key1=\"file_a\",key2=\"csv\""), 1.0, "{metrics}");
    assert_eq!(hits("key1=\"file_*\",key2=\"pdf\""), 3.0, "{metrics}");
    assert!(!metrics.contains("file_a.pdf"), "{metrics}");
    assert!(
        !metrics.contains("acme"),
        "values of other limits stay out: {metrics}"
    );
}

#[tokio::test]
async fn the_current_configuration_language_on_memory_and_redis() {
    let mut server = start_with("", "lang-memory", &[("lang.yaml", CURRENT_LANGUAGE)]);
    current_language(&server).await;
    server.stop();
    let redis = RedisServer::start();
    let storage = redis_storage(&redis);
    let mut server = start_with(&storage, "lang-redis", &[("lang.yaml", CURRENT_LANGUAGE)]);
    current_language(&server).await;
    server.stop();
}
