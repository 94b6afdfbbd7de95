//! `requests_per_unit: 0` answered field by field as envoyproxy/ratelimit
//! answers it: over the limit with the limit and the time to the end of its
//! calendar unit; OK in shadow mode; the other descriptors of the request
//! keep their own statuses (sluice still consumes nothing for a request
//! over the limit: docs/ENVOY.md, deliberate differences).

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use sluice_testkit::RedisServer;

use crate::common::Server;
use crate::{ask, client, codes, descriptor, overall, redis_storage, start_with};

const ZERO: &str = r#"
domain: zero
descriptors:
  - key: blocked
    rate_limit: { unit: minute, requests_per_unit: 0 }
  - key: shadowed
    shadow_mode: true
    rate_limit: { unit: hour, requests_per_unit: 0, name: watch }
  - key: counted
    rate_limit: { unit: minute, requests_per_unit: 3, name: per-minute }
"#;

/// `status` names `requests_per_unit` per `unit` (and `name`), with
/// `remaining` left, resetting within one `unit` (whole seconds).
pub(crate) fn assert_status(status: &DescriptorStatus, limit: (u32, Unit, &str), remaining: u32) {
    let current = status.current_limit.as_ref().expect("current_limit");
    assert_eq!(
        (
            current.requests_per_unit,
            current.unit,
            current.name.as_str()
        ),
        (limit.0, limit.1 as i32, limit.2),
        "{status:?}"
    );
    assert_eq!(status.limit_remaining, remaining, "{status:?}");
    let reset = status
        .duration_until_reset
        .as_ref()
        .expect("duration_until_reset");
    let unit_seconds = match limit.1 {
        Unit::Minute => 60,
        Unit::Hour => 3_600,
        other => panic!("{other:?}"),
    };
    assert!(
        (1..=unit_seconds).contains(&reset.seconds) && reset.nanos == 0,
        "{status:?}"
    );
}

async fn zero_limits(server: &Server) {
    let mut c = client(server).await;
    let code = |s: &DescriptorStatus| Code::try_from(s.code).unwrap();

    // Alone: over, with its limit and when its calendar unit ends.
    let r = ask(&mut c, "zero", vec![descriptor(&[("blocked", "x")])], 0).await;
    assert_eq!(
        (overall(&r), code(&r.statuses[0])),
        (Code::OverLimit, Code::OverLimit)
    );
    assert_status(&r.statuses[0], (0, Unit::Minute, ""), 0);

    // In shadow mode: OK, with the same fields.
    let r = ask(&mut c, "zero", vec![descriptor(&[("shadowed", "x")])], 0).await;
    assert_eq!((overall(&r), code(&r.statuses[0])), (Code::Ok, Code::Ok));
    assert_status(&r.statuses[0], (0, Unit::Hour, "watch"), 0);

    // Beside another descriptor, that one keeps its status: its limit,
    // what it has left (nothing was consumed), its reset.
    let with_blocked = |value: &str| {
        vec![
            descriptor(&[("counted", value)]),
            descriptor(&[("blocked", "x")]),
        ]
    };
    let r = ask(&mut c, "zero", with_blocked("c1"), 0).await;
    assert_eq!(codes(&r), [Code::Ok, Code::OverLimit]);
    assert_status(&r.statuses[0], (3, Unit::Minute, "per-minute"), 3);
    assert_status(&r.statuses[1], (0, Unit::Minute, ""), 0);
    for left in [2, 1, 0] {
        let r = ask(&mut c, "zero", vec![descriptor(&[("counted", "c1")])], 0).await;
        assert_eq!(overall(&r), Code::Ok);
        assert_eq!(r.statuses[0].limit_remaining, left);
    }
    // Spent, it says so beside the zero limit too.
    let r = ask(&mut c, "zero", with_blocked("c1"), 0).await;
    assert_eq!(codes(&r), [Code::OverLimit, Code::OverLimit]);
    assert_status(&r.statuses[0], (3, Unit::Minute, "per-minute"), 0);

    // A shadowed zero limit beside another descriptor: decided as usual.
    let r = ask(
        &mut c,
        "zero",
        vec![
            descriptor(&[("counted", "c2")]),
            descriptor(&[("shadowed", "x")]),
        ],
        0,
    )
    .await;
    assert_eq!(
        (overall(&r), codes(&r)),
        (Code::Ok, vec![Code::Ok, Code::Ok])
    );
    assert_status(&r.statuses[0], (3, Unit::Minute, "per-minute"), 2);
    assert_status(&r.statuses[1], (0, Unit::Hour, "watch"), 0);
}

#[tokio::test]
async fn zero_limits_answer_as_envoyproxy_does_on_memory_and_redis() {
    let mut server = start_with("", "zero-memory", &[("zero.yaml", ZERO)]);
    zero_limits(&server).await;
    server.stop();
    let redis = RedisServer::start();
    let storage = redis_storage(&redis);
    let mut server = start_with(&storage, "zero-redis", &[("zero.yaml", ZERO)]);
    zero_limits(&server).await;
    server.stop();
}
