//! libFuzzer entry of the `timeline` target; the checks live in `custody_fuzz::targets::timeline`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| custody_fuzz::targets::timeline::run(data));
