//! libFuzzer entry of the `wire` target; the checks live in `custody_fuzz::targets::wire`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| custody_fuzz::targets::wire::run(data));
