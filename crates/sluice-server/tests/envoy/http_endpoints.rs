//! envoyproxy/ratelimit's HTTP endpoints: `/healthcheck`, `/json`,
//! `/rlconfig`.

use super::*;

#[tokio::test]
async fn envoyproxy_http_endpoints_healthcheck_json_and_rlconfig() {
    let mut server = start("", "upstream-http");
    let http = reqwest::Client::new();
    let health = http
        .get(format!("{}/healthcheck", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    assert_eq!(health.text().await.unwrap(), "OK");
    // `POST /json`: ShouldRateLimit in protobuf's JSON form.
    let ask_json = |body: serde_json::Value| {
        let http = http.clone();
        let url = format!("{}/json", server.base);
        async move {
            let response = http.post(url).json(&body).send().await.unwrap();
            let status = response.status().as_u16();
            (status, response.text().await.unwrap())
        }
    };
    let request = serde_json::json!({
        "domain": "edge",
        "descriptors": [{"entries": [{"key": "remote_address", "value": "10.9.9.9"}]}],
        "hitsAddend": 1
    });
    let (status, body) = ask_json(request.clone()).await;
    assert_eq!(status, 200, "{body}");
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["overallCode"], "OK");
    assert_eq!(answer["statuses"][0]["code"], "OK");
    assert_eq!(answer["statuses"][0]["limitRemaining"], 2);
    assert_eq!(answer["statuses"][0]["currentLimit"]["requestsPerUnit"], 3);
    assert_eq!(answer["statuses"][0]["currentLimit"]["unit"], "MINUTE");
    // snake_case names, as protobuf's JSON parser also takes them.
    let snake = serde_json::json!({
        "domain": "edge",
        "descriptors": [{"entries": [{"key": "remote_address", "value": "10.9.9.9"}], "hits_addend": "2"}]
    });
    let (status, body) = ask_json(snake).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = ask_json(request).await;
    assert_eq!(status, 429, "{body}");
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["overallCode"], "OVER_LIMIT");
    for bad in [
        serde_json::json!({"domain": "edge", "descriptors": []}),
        serde_json::json!({"domain": "edge", "bogus": 1}),
        serde_json::json!([]),
        serde_json::json!({"domain": "edge", "descriptors": [5]}),
        serde_json::json!({"domain": "edge", "descriptors": [{"entries": ["x"]}]}),
        serde_json::json!({"domain": "edge", "descriptors": [{"entries": [], "limit": 5}]}),
    ] {
        let (status, body) = ask_json(bad).await;
        assert_eq!(status, 400, "{body}");
        assert!(!body.contains("Json"), "no type of ours: {body}");
    }
    // Numbers as protobuf's JSON writes them (a string of one too); the
    // field of anything else named.
    let entry = serde_json::json!([{"key": "remote_address", "value": "10.9.9.8"}]);
    let (status, body) = ask_json(serde_json::json!({
        "domain": "edge", "descriptors": [{"entries": entry}], "hitsAddend": "1"
    }))
    .await;
    assert_eq!(status, 200, "{body}");
    for (bad, field) in [
        (serde_json::json!({"hitsAddend": -1}), "hitsAddend"),
        (serde_json::json!({"hitsAddend": "many"}), "hitsAddend"),
        (
            serde_json::json!({"hitsAddend": 4294967296u64}),
            "hitsAddend",
        ),
        (
            serde_json::json!({"descriptors": [{"entries": entry, "hitsAddend": "abc"}]}),
            "descriptors[0].hits_addend",
        ),
        (
            serde_json::json!({"descriptors": [{"entries": entry, "hitsAddend": true}]}),
            "descriptors[0].hits_addend",
        ),
        (
            serde_json::json!({"descriptors": [{"entries": entry, "limit": {"requestsPerUnit": 5, "unit": "FORTNIGHT"}}]}),
            "descriptors[0].limit.unit",
        ),
    ] {
        let mut request = serde_json::json!({
            "domain": "edge", "descriptors": [{"entries": entry}]
        });
        for (key, value) in bad.as_object().unwrap() {
            request[key] = value.clone();
        }
        let (status, body) = ask_json(request).await;
        assert_eq!(status, 400, "{bad}: {body}");
        let problem: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(problem["invalid-params"][0]["name"], field, "{body}");
    }
    // `/rlconfig`: the loaded limits, keys and numbers only.
    let dump = common::get_text(&http, &server, "/rlconfig").await;
    assert!(
        dump.contains(
            "edge.remote_address: unit=MINUTE requests_per_unit=3, shadow_mode: false, quota_mode: false"
        ),
        "{dump}"
    );
    assert!(!dump.contains("3e1d9c7b"), "no secrets");
    server.stop();
}
