//! The checked-in JSON Schemas are what the types generate, and every message of every
//! schema version still decodes (WI-03).
#![allow(clippy::unwrap_used, clippy::expect_used)]
// The tests read the checked-in schema files; the library itself does no IO.
#![allow(clippy::disallowed_methods)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use host_wire::{decode_request, schemas, METHODS, WIRE_VERSION};

fn schema_dir(version: u32) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("schema")
        .join(version.to_string())
}

fn files_under(dir: &Path, base: &Path, out: &mut BTreeSet<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n == "examples") {
                continue;
            }
            files_under(&path, base, out);
        } else {
            let rel = path
                .strip_prefix(base)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            out.insert(rel);
        }
    }
}

// WI-03
#[test]
fn the_checked_in_schemas_are_what_the_types_generate() {
    let dir = schema_dir(WIRE_VERSION);
    let generated = schemas();
    if std::env::var_os("UPDATE_WIRE_SCHEMA").is_some() {
        for (path, text) in &generated {
            let file = dir.join(path);
            std::fs::create_dir_all(file.parent().unwrap()).unwrap();
            std::fs::write(&file, text).unwrap();
        }
    }
    let mut on_disk = BTreeSet::new();
    files_under(&dir, &dir, &mut on_disk);
    let names: BTreeSet<String> = generated.iter().map(|(p, _)| p.clone()).collect();
    assert_eq!(
        on_disk, names,
        "schema/{WIRE_VERSION}/ holds other files than the types generate \
         (UPDATE_WIRE_SCHEMA=1 cargo test -p host-wire --test schema rewrites them)"
    );
    for (path, text) in &generated {
        let held = std::fs::read_to_string(dir.join(path)).unwrap();
        // Compared as JSON, not as text: the order of an object's keys depends on
        // whether some crate in the build turned on serde_json's `preserve_order`.
        let held: serde_json::Value = serde_json::from_str(&held).unwrap();
        let made: serde_json::Value = serde_json::from_str(text).unwrap();
        assert!(
            held == made,
            "schema/{WIRE_VERSION}/{path} drifted from the types \
             (UPDATE_WIRE_SCHEMA=1 cargo test -p host-wire --test schema rewrites it; \
             a change must only add)"
        );
    }
    // One result schema per method.
    for method in METHODS {
        assert!(
            names.contains(&format!("results/{method}.json")),
            "{method}"
        );
    }
}

fn validator(version: u32, file: &str) -> jsonschema::Validator {
    let text = std::fs::read_to_string(schema_dir(version).join(file)).unwrap();
    let schema: serde_json::Value = serde_json::from_str(&text).unwrap();
    jsonschema::draft202012::new(&schema).unwrap()
}

fn versions() -> Vec<u32> {
    let mut v: Vec<u32> = std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("schema"))
        .unwrap()
        .filter_map(|e| e.unwrap().file_name().to_str()?.parse().ok())
        .collect();
    v.sort_unstable();
    v
}

fn examples(version: u32, kind: &str) -> Vec<(String, String)> {
    let dir = schema_dir(version).join("examples").join(kind);
    if !dir.exists() {
        // A version that added no message of this kind holds no examples of it.
        return Vec::new();
    }
    let mut out: Vec<(String, String)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| {
            let path = e.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read_to_string(&path).unwrap())
        })
        .collect();
    out.sort();
    out
}

// WI-03: additive only. The requests of every version, this one's included, decode
// with this version's decoder and validate against this version's schema; each
// version's examples show what it added, and together they hold every method.
#[test]
fn every_versions_requests_still_decode() {
    let now = validator(WIRE_VERSION, "request.json");
    let mut methods_seen = BTreeSet::new();
    for version in versions() {
        let then = validator(version, "request.json");
        for (name, text) in examples(version, "requests") {
            let value: serde_json::Value = serde_json::from_str(&text).unwrap();
            assert!(
                then.is_valid(&value),
                "v{version} {name} against its own schema"
            );
            assert!(
                now.is_valid(&value),
                "v{version} {name} against v{WIRE_VERSION}"
            );
            let request = decode_request(&text)
                .unwrap_or_else(|r| panic!("v{version} {name} no longer decodes: {r}"));
            request.call.clone().into_client_request().unwrap();
            methods_seen.insert(request.call.method());
        }
    }
    let all: BTreeSet<&str> = METHODS.iter().copied().collect();
    assert_eq!(methods_seen, all, "an example request for every method");
}

// WI-03: the notifications of every version validate against this version's schema.
#[test]
fn every_versions_notifications_still_validate() {
    let now = validator(WIRE_VERSION, "notification.json");
    for version in versions() {
        for (name, text) in examples(version, "notifications") {
            let value: serde_json::Value = serde_json::from_str(&text).unwrap();
            assert!(now.is_valid(&value), "v{version} {name}");
            let _: host_wire::Notification = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("v{version} {name} no longer decodes: {e}"));
        }
    }
}

// WI-03: a negative control: the validator refuses what the schema does not allow.
#[test]
fn the_request_schema_refuses_what_the_decoder_refuses() {
    let v = validator(WIRE_VERSION, "request.json");
    for bad in [
        r#"{"jsonrpc":"1.0","id":1,"method":"run.list","params":{}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"run.nothing","params":{}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"run.chatLoad","params":{}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"run.chatLoad","params":{"appSessionId":"  "}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"run.chatResolveApproval","params":{"requestId":"r","threadId":"t","turnId":"u","itemId":"i","decision":"maybe","idempotencyKey":"k"}}"#,
    ] {
        let value: serde_json::Value = serde_json::from_str(bad).unwrap();
        assert!(!v.is_valid(&value), "the schema took {bad}");
        assert!(decode_request(bad).is_err(), "the decoder took {bad}");
    }
}
