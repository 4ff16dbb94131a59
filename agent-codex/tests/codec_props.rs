//! Properties of the codec and the rollout reader on arbitrary input: nothing the server
//! or a file holds makes them panic, and every line is either typed or counted.

use agent_codex::codec::{Codec, LineError};
use agent_codex::diag::Skip;
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
}
