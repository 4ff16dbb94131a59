//! libFuzzer entry of the `tokens` target; the checks live in `custody_fuzz::targets::tokens`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| custody_fuzz::targets::tokens::run(data));
