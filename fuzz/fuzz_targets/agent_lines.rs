//! libFuzzer entry of the `agent_lines` target; the checks live in `custody_fuzz::targets::agent_lines`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| custody_fuzz::targets::agent_lines::run(data));
