//! libFuzzer entry of the `rows` target; the checks live in `custody_fuzz::targets::rows`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| custody_fuzz::targets::rows::run(data));
