//! libFuzzer entry of the `envelope` target; the checks live in `custody_fuzz::targets::envelope`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| custody_fuzz::targets::envelope::run(data));
