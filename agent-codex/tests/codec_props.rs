//! Properties of the codec and the rollout reader on arbitrary input: nothing the server
//! or a file holds makes them panic, and every line is either typed or counted.

use agent_codex::codec::{Codec, Incoming, LineError};
use agent_codex::diag::Skip;
use agent_codex::protocol::{Notification, ServerNotification};
use agent_codex::rollout::RolloutReader;
use proptest::prelude::*;

const METHODS: &[&str] = &[
    "item/started",
    "item/completed",
    "item/agentMessage/delta",
    "turn/started",
    "turn/completed",
    "serverRequest/resolved",
    "thread/started",
    "item/fileChange/requestApproval",
    "item/commandExecution/requestApproval",
    "some/new/method",
];

fn json_value() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        "[a-zA-Z/ ]{0,12}".prop_map(serde_json::Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
            prop::collection::btree_map(
                prop_oneof![
                    Just("type".to_owned()),
                    Just("id".to_owned()),
                    Just("item".to_owned()),
                    Just("turn".to_owned()),
                    Just("threadId".to_owned()),
                    Just("turnId".to_owned()),
                    Just("itemId".to_owned()),
                    Just("delta".to_owned()),
                    "[a-z]{1,6}",
                ],
                inner,
                0..5
            )
            .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    // Any bytes: a typed value or a counted, typed error; never a panic.
    #[test]
    fn any_bytes_are_read_or_refused(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        let mut c = Codec::new();
        if c.handle_line(&bytes).is_err() {
            prop_assert_eq!(c.diagnostics().total(Skip::Malformed), 1);
        }
        let mut r = RolloutReader::new();
        let b = r.read(&bytes);
        prop_assert!(b.consumed <= bytes.len());
    }

    // Known and unknown methods with arbitrary params: the same.
    #[test]
    fn any_params_are_read_or_refused(
        method in prop::sample::select(METHODS),
        id in prop::option::of(0i64..5),
        params in json_value(),
    ) {
        let mut line = serde_json::json!({ "method": method, "params": params });
        if let Some(id) = id {
            line["id"] = id.into();
        }
        let mut c = Codec::new();
        match c.handle_line(line.to_string().as_bytes()) {
            Ok(_) => prop_assert_eq!(c.diagnostics().total(Skip::Malformed), 0),
            Err(LineError::Shape { .. }) => {
                prop_assert_eq!(c.diagnostics().total(Skip::Malformed), 1)
            }
            Err(e) => prop_assert!(false, "a JSON-RPC line refused as {e:?}"),
        }
    }

    // The fast path of delta lines answers exactly what the general reader answers
    // (a JSON tree, then the typed notification), whatever the line's shape: fields
    // missing or mistyped, extra fields, escapes, an `id`, an odd `emittedAtMs`, an
    // array where an object belongs.
    #[test]
    fn delta_lines_read_as_the_general_reader_reads_them(
        method in prop::sample::select(&[
            "item/agentMessage/delta",
            "item/reasoning/summaryTextDelta",
            "item/reasoning/textDelta",
            "item/commandExecution/outputDelta",
            "item/plan/delta",
            "item/future/newDelta",
        ][..]),
        fields in prop::collection::vec(
            prop::option::weighted(
                0.93,
                prop_oneof![
                    6 => r#"[a-zA-Z \\"\n\u{e9}\u{1f600}]{0,8}"#.prop_map(serde_json::Value::from),
                    1 => json_value(),
                ],
            ),
            5,
        ),
        emitted in prop_oneof![
            Just(None),
            (0u64..1 << 53).prop_map(|n| Some(serde_json::Value::from(n))),
            Just(Some(serde_json::json!(-1))),
            Just(Some(serde_json::json!(1.5))),
            Just(Some(serde_json::json!("7"))),
        ],
        id in prop::option::of(prop_oneof![Just(serde_json::Value::Null), (0i64..3).prop_map(serde_json::Value::from)]),
        params_as_array in prop::bool::weighted(0.1),
    ) {
        let keys = ["threadId", "turnId", "itemId", "delta", "summaryIndex"];
        let present: Vec<(&str, serde_json::Value)> = keys
            .iter()
            .zip(fields)
            .filter_map(|(k, v)| v.map(|v| (*k, v)))
            .collect();
        let params = if params_as_array {
            serde_json::Value::Array(present.iter().map(|(_, v)| v.clone()).collect())
        } else {
            serde_json::Value::Object(present.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
        };
        let mut line = serde_json::json!({ "method": method, "params": params.clone() });
        if let Some(e) = &emitted {
            line["emittedAtMs"] = e.clone();
        }
        if let Some(i) = &id {
            line["id"] = i.clone();
        }
        let got = Codec::new().handle_line(line.to_string().as_bytes());
        // The general reader, by hand.
        let is_request = id.as_ref().is_some_and(|i| !i.is_null());
        if is_request {
            prop_assert!(!matches!(got, Ok(Incoming::Notification(_))), "{got:?}");
        } else {
            let body = ServerNotification::from_parts(method, &params);
            let expected = body.map(|body| Notification {
                emitted_at_ms: emitted.as_ref().and_then(serde_json::Value::as_u64),
                body,
            });
            match (got, expected) {
                (Ok(Incoming::Notification(n)), Ok(e)) => prop_assert_eq!(n, e),
                (Err(LineError::Shape { shape, .. }), Err(e)) => prop_assert_eq!(shape, e),
                (g, e) => prop_assert!(false, "got {g:?}, expected {e:?}"),
            }
        }
    }
}
