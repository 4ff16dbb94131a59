//! libFuzzer entry of the `overlay_replay` target; the checks live in `custody_fuzz::targets::overlay_replay`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| custody_fuzz::targets::overlay_replay::run(data));
