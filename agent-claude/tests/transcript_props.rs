//! Properties of the transcript reader and the stream decoder on any input: reading a
//! file in any split equals reading it whole (the torn-line contract), every line is
//! counted once, and no byte sequence panics.

use agent_claude::stream::StreamDecoder;
use agent_claude::transcript::Transcript;
use proptest::prelude::*;

const LINES: &[&str] = &[
    r#"{"type":"user","uuid":"u1","timestamp":"2026-01-01T00:00:00Z","message":{"role":"user","content":"héllo"}}"#,
    r#"{"type":"assistant","uuid":"a1","message":{"id":"m1","content":[{"type":"thinking","thinking":"t"}]}}"#,
    r#"{"type":"assistant","uuid":"a2","message":{"id":"m1","content":[{"type":"tool_use","id":"toolu_1","name":"Bash","input":{"command":"ls"}}]}}"#,
    r#"{"type":"user","uuid":"u2","message":{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"a\nb"}]}}"#,
    r#"{"type":"assistant","uuid":"a3","message":{"id":"m1","content":[{"type":"text","text":"done"}]}}"#,
    r#"{"type":"progress","uuid":"p1","data":{}}"#,
    r#"{"type":"summary","summary":"x"}"#,
    r#"{"type":"system","subtype":"compact_boundary","uuid":"c1","content":"Conversation compacted"}"#,
    r#"{"type":"future-kind","uuid":"f1"}"#,
    r#"not json"#,
    r#""#,
];

fn file() -> impl Strategy<Value = Vec<u8>> {
    (prop::collection::vec(0..LINES.len(), 0..24), any::<bool>()).prop_map(
        |(picks, newline_at_end)| {
            let mut s = picks
                .iter()
                .map(|&i| LINES[i])
                .collect::<Vec<_>>()
                .join("\n");
            if newline_at_end {
                s.push('\n');
            }
            s.into_bytes()
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    // Feeding in pieces (keeping the unconsumed tail, as a tailing reader does) gives
    // the same items and diagnostics as feeding the whole file at once.
    #[test]
    fn any_split_reads_like_the_whole(bytes in file(), cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..6)) {
        let mut whole = Transcript::new();
        let used = whole.feed(&bytes);
        let mut cuts: Vec<usize> = cuts.iter().map(|i| i.index(bytes.len() + 1)).collect();
        cuts.sort_unstable();
        cuts.push(bytes.len());
        let mut split = Transcript::new();
        let mut pending: Vec<u8> = Vec::new();
        let mut last = 0;
        for c in cuts {
            pending.extend_from_slice(&bytes[last..c]);
            last = c;
            let n = split.feed(&pending);
            pending.drain(..n);
        }
        prop_assert_eq!(split.items(), whole.items());
        prop_assert_eq!(split.diagnostics(), whole.diagnostics());
        prop_assert_eq!(pending.len(), bytes.len() - used);
        let d = whole.diagnostics();
        prop_assert_eq!(d.accounted(), d.lines);
    }

    // No byte sequence panics the decoder or the reader; every line is counted once.
    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let mut dec = StreamDecoder::new().audit_fields(true);
        for line in bytes.split(|b| *b == b'\n') {
            let _ignored = dec.decode(line);
        }
        prop_assert_eq!(dec.diagnostics().accounted(), dec.diagnostics().lines);
        let mut t = Transcript::new();
        let n = t.feed(&bytes);
        prop_assert!(n <= bytes.len());
        prop_assert_eq!(t.diagnostics().accounted(), t.diagnostics().lines);
    }
}
