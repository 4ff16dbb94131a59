//! libFuzzer entry of the `history` target; the checks live in `custody_fuzz::targets::history`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| custody_fuzz::targets::history::run(data));
