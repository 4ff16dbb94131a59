//! Target `agent_lines`: what the real agents print and write, through the agent crates'
//! decoders (Codex app-server lines and rollout files, Claude stream-json lines and
//! transcripts).
//!
//! Checks:
//!
//! - no line and no file content panics a decoder: every line is typed, or refused with
//!   a typed error, or skipped and counted;
//! - a rollout or a transcript read in two parts (the second read starting where the
//!   first said it stopped, as a reader of a file being written does) uses the same
//!   bytes and gives exactly what one read of the whole gives (for a transcript: when
//!   its complete lines are JSON, see the note in `run`).
//!
//! Script: one mode byte, one split byte, then the text (lines or file content):
//! mode 0 Codex app-server lines, 1 a Codex rollout, 2 Claude stream-json lines, 3 a
//! Claude transcript. The split byte places the cut at `split / 255` of the text.

use agent_claude::stream::StreamDecoder;
use agent_claude::transcript::Transcript;
use agent_codex::codec::Codec;
use agent_codex::rollout::RolloutReader;

/// Writes a script for `mode` (0 to 3), a cut at `split / 255`, and `text`.
pub fn write(mode: u8, split: u8, text: &[u8]) -> Vec<u8> {
    let mut out = vec![mode, split];
    out.extend_from_slice(text);
    out
}

/// Runs one input.
pub fn run(data: &[u8]) {
    let [mode, split, text @ ..] = data else {
        return;
    };
    let cut = text.len() * usize::from(*split) / 255;
    match mode % 4 {
        0 => {
            let mut codec = Codec::new();
            let mut refused = 0usize;
            for line in text.split(|b| *b == b'\n') {
                if codec.handle_line(line).is_err() {
                    refused += 1;
                }
            }
            assert!(refused <= text.len() + 1);
        }
        1 => {
            let whole = RolloutReader::new().read(text);
            let mut reader = RolloutReader::new();
            let first = reader.read(&text[..cut]);
            let rest = reader.read(&text[first.consumed..]);
            let mut lines = first.lines;
            lines.extend(rest.lines);
            assert_eq!(lines, whole.lines, "a rollout read in two parts");
            assert_eq!(first.consumed + rest.consumed, whole.consumed);
        }
        2 => {
            let mut decoder = StreamDecoder::new();
            for line in text.split(|b| *b == b'\n') {
                if let Some(decoded) = decoder.decode(line) {
                    std::hint::black_box(decoded);
                }
            }
        }
        _ => {
            let mut whole = Transcript::new();
            let consumed = whole.feed(text);
            let mut parts = Transcript::new();
            let first = parts.feed(&text[..cut]);
            let second = parts.feed(&text[first..]);
            assert_eq!(first + second, consumed, "bytes used in two parts");
            // A last line without its newline waits for the next read, whatever it
            // holds, so a transcript reads the same however it is cut.
            assert_eq!(
                parts.items(),
                whole.items(),
                "a transcript read in two parts"
            );
            // At the end of the file the rest is read too, as a whole line.
            let mut ended = Transcript::new();
            let mut cut_end = Transcript::new();
            cut_end.finish(text);
            let used = ended.feed(&text[..cut]);
            ended.finish(&text[used..]);
            assert_eq!(
                ended.items(),
                cut_end.items(),
                "a transcript finished in two parts"
            );
        }
    }
}
