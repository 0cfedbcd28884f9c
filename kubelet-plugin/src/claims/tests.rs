use std::sync::Mutex;

use async_trait::async_trait;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

use super::*;

fn claim(uid: &str, namespace: &str, name: &str) -> ClaimRef {
    ClaimRef {
        uid: uid.into(),
        namespace: namespace.into(),
        name: name.into(),
    }
}

/// Answers from a table by claim name (`fail-retry-*`, `fail-*`, anything else
/// succeeds with one device named after the claim) and records every call.
#[derive(Default)]
struct FakeTablePlugin {
    calls: Mutex<Vec<(Method, String)>>,
}

impl FakeTablePlugin {
    fn answer(&self, method: Method, claim: &ClaimRef) -> Result<(), ClaimFailure> {
        self.calls.lock().unwrap().push((method, claim.uid.clone()));
        if claim.name.starts_with("fail-retry") {
            Err(ClaimFailure::retryable(format!("{} waits", claim.name)))
        } else if claim.name.starts_with("fail") {
            Err(ClaimFailure::permanent(format!("{} is broken", claim.name)))
        } else {
            Ok(())
        }
    }

    fn called(&self) -> Vec<(Method, String)> {
        self.calls.lock().unwrap().clone()
    }
}

#[async_trait]
impl NodePlugin for FakeTablePlugin {
    async fn prepare(&self, claim: ClaimRef) -> Result<Vec<PreparedDevice>, ClaimFailure> {
        self.answer(Method::Prepare, &claim)?;
        Ok(vec![PreparedDevice {
            request_names: vec!["channel".into()],
            pool_name: "node-a".into(),
            device_name: format!("dev-{}", claim.name),
            cdi_device_ids: vec![format!("k8s.example.com/claim={}", claim.uid)],
        }])
    }

    async fn unprepare(&self, claim: ClaimRef) -> Result<(), ClaimFailure> {
        self.answer(Method::Unprepare, &claim)
    }
}

#[test]
fn an_empty_request_is_invalid() {
    let status = check_claims(vec![]).unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert_eq!(status.message(), "the request names no claims");
}

#[test]
fn a_claim_without_uid_fails_the_call_naming_its_index() {
    let status = check_claims(vec![claim("u0", "ns", "a"), claim("", "ns", "b")]).unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().starts_with("claim 1 "),
        "{}",
        status.message()
    );
    assert!(status.message().contains("\"b\""), "{}", status.message());
}

#[test]
fn a_claim_without_namespace_or_name_is_refused_alone() {
    let checked = check_claims(vec![
        claim("u0", "", "a"),
        claim("u1", "ns", ""),
        claim("u2", "", ""),
        claim("u3", "ns", "d"),
    ])
    .unwrap();
    let reasons: Vec<_> = checked
        .iter()
        .map(|c| match c {
            Checked::Refused { uid, reason } => format!("{uid}: {reason}"),
            Checked::Call(claim) => format!("call {}", claim.uid),
        })
        .collect();
    assert!(
        reasons[0].starts_with("u0: claim u0 has no namespace:"),
        "{reasons:?}"
    );
    assert!(
        reasons[1].starts_with("u1: claim u1 has no name:"),
        "{reasons:?}"
    );
    assert!(
        reasons[2].contains("no namespace and no name"),
        "{reasons:?}"
    );
    assert_eq!(reasons[3], "call u3");
}

#[test]
fn a_repeated_claim_is_answered_once_and_a_conflicting_uid_is_invalid() {
    let checked = check_claims(vec![claim("u", "ns", "a"), claim("u", "ns", "a")]).unwrap();
    assert_eq!(checked, vec![Checked::Call(claim("u", "ns", "a"))]);

    let status = check_claims(vec![
        claim("u", "ns", "a"),
        claim("v", "ns", "b"),
        claim("u", "ns", "c"),
    ])
    .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status
            .message()
            .contains("claims 0 and 2 have the same uid \"u\"")
            && status.message().contains("ns/a and ns/c"),
        "{}",
        status.message()
    );
}

/// Counter values by name and labels. A debugging snapshot resets what it reads, so a
/// test takes one and looks everything up in it.
struct Counters(Vec<CounterValue>);

/// Name, labels, value.
type CounterValue = (String, Vec<(String, String)>, u64);

impl Counters {
    fn take(recorder: &DebuggingRecorder) -> Self {
        let snapshot = recorder.snapshotter().snapshot().into_vec();
        Self(
            snapshot
                .into_iter()
                .filter(|(key, ..)| key.key().name() != REQUEST_SECONDS)
                .map(|(key, _, _, value)| {
                    let key = key.key();
                    let labels = key
                        .labels()
                        .map(|l| (l.key().to_string(), l.value().to_string()))
                        .collect();
                    let DebugValue::Counter(n) = value else {
                        panic!("{} is not a counter", key.name());
                    };
                    (key.name().to_string(), labels, n)
                })
                .collect(),
        )
    }

    fn get(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.0
            .iter()
            .filter(|(n, have, _)| {
                n == name
                    && labels
                        .iter()
                        .all(|(k, v)| have.iter().any(|(hk, hv)| hk == k && hv == v))
            })
            .map(|(.., value)| value)
            .sum()
    }
}

#[test]
fn every_claim_gets_its_own_answer_and_is_counted() {
    let recorder = DebuggingRecorder::new();
    let plugin = Arc::new(FakeTablePlugin::default());
    let handler = ClaimHandler::new(plugin.clone(), CallGate::new());
    let answers = metrics::with_local_recorder(&recorder, || {
        futures::executor::block_on(handler.prepare(
            DraVersion::V1beta1,
            vec![
                claim("u-ok", "ns", "ok"),
                claim("u-retry", "ns", "fail-retry"),
                claim("u-perm", "ns", "fail"),
                claim("u-noname", "ns", ""),
            ],
        ))
    })
    .unwrap();

    assert_eq!(answers.len(), 4);
    assert_eq!(answers["u-ok"].as_ref().unwrap()[0].device_name, "dev-ok");
    assert_eq!(answers["u-retry"].as_ref().unwrap_err(), "fail-retry waits");
    assert_eq!(answers["u-perm"].as_ref().unwrap_err(), "fail is broken");
    assert!(
        answers["u-noname"]
            .as_ref()
            .unwrap_err()
            .contains("has no name")
    );
    let mut called = plugin.called();
    called.sort_by(|a, b| a.1.cmp(&b.1));
    assert_eq!(
        called,
        [
            (Method::Prepare, "u-ok".to_string()),
            (Method::Prepare, "u-perm".to_string()),
            (Method::Prepare, "u-retry".to_string()),
        ],
        "the refused claim never reaches the node"
    );

    let counters = Counters::take(&recorder);
    let labels = |outcome| {
        [
            ("method", "NodePrepareResources"),
            ("version", "v1beta1"),
            ("outcome", outcome),
        ]
    };
    assert_eq!(counters.get(REQUESTS_TOTAL, &labels("claim_errors")), 1);
    assert_eq!(counters.get(REQUESTS_TOTAL, &labels("ok")), 0);
    for outcome in ["ok", "retryable_error", "permanent_error", "invalid"] {
        assert_eq!(counters.get(CLAIMS_TOTAL, &labels(outcome)), 1, "{outcome}");
    }
}

#[test]
fn unprepare_calls_are_counted_by_outcome_too() {
    let recorder = DebuggingRecorder::new();
    let plugin = Arc::new(FakeTablePlugin::default());
    let gate = CallGate::new();
    let handler = ClaimHandler::new(plugin.clone(), gate.clone());
    metrics::with_local_recorder(&recorder, || {
        let answers = futures::executor::block_on(
            handler.unprepare(DraVersion::V1, vec![claim("u", "ns", "a")]),
        )
        .unwrap();
        assert_eq!(answers["u"], Ok(()));
        let status =
            futures::executor::block_on(handler.unprepare(DraVersion::V1, vec![])).unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        gate.close();
        let status = futures::executor::block_on(
            handler.unprepare(DraVersion::V1, vec![claim("u", "ns", "a")]),
        )
        .unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unavailable);
    });
    let counters = Counters::take(&recorder);
    let labels = |outcome| {
        [
            ("method", "NodeUnprepareResources"),
            ("version", "v1"),
            ("outcome", outcome),
        ]
    };
    for outcome in ["ok", "invalid_argument", "unavailable"] {
        assert_eq!(
            counters.get(REQUESTS_TOTAL, &labels(outcome)),
            1,
            "{outcome}"
        );
    }
    assert_eq!(
        plugin.called().len(),
        1,
        "neither refused call reached the node"
    );
    assert_eq!(gate.in_flight(), 0);
}

/// The seconds each answered call took, by method; calls refused whole are not timed.
fn call_seconds(recorder: &DebuggingRecorder) -> Vec<(String, usize)> {
    recorder
        .snapshotter()
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| key.key().name() == REQUEST_SECONDS)
        .map(|(key, _, _, value)| {
            let method = key
                .key()
                .labels()
                .find(|l| l.key() == "method")
                .map(|l| l.value().to_string())
                .unwrap_or_default();
            let DebugValue::Histogram(samples) = value else {
                panic!("{REQUEST_SECONDS} is not a histogram");
            };
            (method, samples.len())
        })
        .collect()
}

#[test]
fn answered_calls_are_timed_by_method_and_refused_ones_are_not() {
    let recorder = DebuggingRecorder::new();
    let plugin = Arc::new(FakeTablePlugin::default());
    let gate = CallGate::new();
    let handler = ClaimHandler::new(plugin, gate.clone());
    metrics::with_local_recorder(&recorder, || {
        futures::executor::block_on(async {
            handler
                .prepare(DraVersion::V1, vec![claim("u1", "ns", "ok")])
                .await
                .unwrap();
            handler
                .prepare(DraVersion::V1, vec![claim("u2", "ns", "fail")])
                .await
                .unwrap();
            handler
                .unprepare(DraVersion::V1, vec![claim("u1", "ns", "ok")])
                .await
                .unwrap();
            handler.prepare(DraVersion::V1, vec![]).await.unwrap_err();
        })
    });
    let mut timed = call_seconds(&recorder);
    timed.sort();
    assert_eq!(
        timed,
        [
            ("NodePrepareResources".to_string(), 2),
            ("NodeUnprepareResources".to_string(), 1)
        ]
    );
}
