//! Properties of the transcript reader and the stream decoder on any input: reading a
//! file in any split equals reading it whole (the torn-line contract), conversation
//! included; every line is counted once; `finish` reads every byte; and no byte
//! sequence panics.

use agent_claude::stream::StreamDecoder;
use agent_claude::transcript::Transcript;
use proptest::prelude::*;

const LINES: &[&str] = &[
    r#"{"type":"user","uuid":"u1","timestamp":"2026-01-01T00:00:00Z","message":{"role":"user","content":"héllo"}}"#,
    r#"{"type":"assistant","uuid":"a1","message":{"id":"m1","content":[{"type":"thinking","thinking":"t"}]}}"#,
    r#"{"type":"assistant","uuid":"a2","message":{"id":"m1","content":[{"type":"tool_use","id":"toolu_1","name":"Bash","input":{"command":"ls"}}]}}"#,
    r#"{"type":"user","uuid":"u2","message":{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"a\nb"}]}}"#,
    r#"{"type":"assistant","uuid":"a3","message":{"id":"m1","content":[{"type":"text","text":"done"}]}}"#,
    r#"{"type":"user","uuid":"e1","parentUuid":"a1","message":{"role":"user","content":"edited"}}"#,
    r#"{"type":"user","uuid":"e2","parentUuid":"u1","isSidechain":true,"message":{"role":"user","content":"side"}}"#,
    r#"{"type":"assistant","uuid":"a4","parentUuid":"p1","message":{"id":"m2","content":[{"type":"text","text":"after progress"}]}}"#,
    r#"{"type":"progress","uuid":"p1","parentUuid":"u2"}"#,
    r#"{"a":1}}"#,
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
        let conversation = |t: &Transcript| t.visible_items().map(|(_, i)| i.position.clone()).collect::<Vec<_>>();
        prop_assert_eq!(conversation(&split), conversation(&whole));
        prop_assert_eq!(split.diagnostics(), whole.diagnostics());
        prop_assert_eq!(pending.len(), bytes.len() - used);
        let d = whole.diagnostics();
        prop_assert_eq!(d.accounted(), d.lines);
    }

    // `finish` reads every byte: one more line when the file does not end with a
    // newline, and every line is counted once.
    #[test]
    fn finish_reads_every_byte(bytes in file()) {
        let mut t = Transcript::new();
        let used = t.feed(&bytes);
        let lines_fed = t.diagnostics().lines;
        prop_assert_eq!(t.finish(&bytes[used..]), bytes.len() - used);
        prop_assert_eq!(t.read_to(), bytes.len() as u64);
        let extra = u64::from(used < bytes.len());
        prop_assert_eq!(t.diagnostics().lines, lines_fed + extra);
        prop_assert_eq!(t.diagnostics().accounted(), t.diagnostics().lines);
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
