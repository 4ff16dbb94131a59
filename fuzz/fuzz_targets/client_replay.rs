//! libFuzzer entry of the `client_replay` target; the checks live in `custody_fuzz::targets::client_replay`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| custody_fuzz::targets::client_replay::run(data));
