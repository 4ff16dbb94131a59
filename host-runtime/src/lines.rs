//! Newline-delimited lines out of a byte stream, with a bound on each line's length.
//!
//! A line longer than the bound is dropped as it streams: its bytes are never kept past
//! the bound, and the reader learns of it once ([`Piece::TooLong`]). A last line without
//! its newline is a line when the stream ends.

/// One piece [`LineSplitter`] cut.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Piece {
    /// A whole line, without its newline (a `\r` before it is kept).
    Line(Vec<u8>),
    /// A line longer than the bound went by; its bytes were dropped.
    TooLong,
}

/// Cuts bytes into lines of at most `max` bytes.
#[derive(Debug)]
pub(crate) struct LineSplitter {
    max: usize,
    buf: Vec<u8>,
    /// Inside a line that passed the bound: bytes are dropped until its newline.
    dropping: bool,
}

impl LineSplitter {
    /// A splitter whose lines hold at most `max` bytes.
    pub(crate) fn new(max: usize) -> LineSplitter {
        LineSplitter {
            max,
            buf: Vec::new(),
            dropping: false,
        }
    }

    /// Takes `bytes`; the pieces they complete go into `out`.
    pub(crate) fn push(&mut self, mut bytes: &[u8], out: &mut Vec<Piece>) {
        while !bytes.is_empty() {
            let newline = bytes.iter().position(|&b| b == b'\n');
            let (part, rest, ends) = match newline {
                Some(i) => (&bytes[..i], &bytes[i + 1..], true),
                None => (bytes, &[][..], false),
            };
            if !self.dropping {
                if self.buf.len() + part.len() > self.max {
                    self.buf.clear();
                    self.dropping = true;
                    out.push(Piece::TooLong);
                } else {
                    self.buf.extend_from_slice(part);
                }
            }
            if ends {
                if !self.dropping {
                    out.push(Piece::Line(std::mem::take(&mut self.buf)));
                }
                self.dropping = false;
            }
            bytes = rest;
        }
    }

    /// The stream ended: a last line without its newline, if any.
    pub(crate) fn finish(&mut self) -> Option<Piece> {
        self.dropping = false;
        (!self.buf.is_empty()).then(|| Piece::Line(std::mem::take(&mut self.buf)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cut(max: usize, chunks: &[&[u8]]) -> Vec<Piece> {
        let mut s = LineSplitter::new(max);
        let mut out = Vec::new();
        for c in chunks {
            s.push(c, &mut out);
        }
        out.extend(s.finish());
        out
    }

    #[test]
    fn lines_are_cut_at_newlines_across_chunks() {
        let got = cut(16, &[b"ab", b"c\nde", b"\n\nf"]);
        assert_eq!(
            got,
            vec![
                Piece::Line(b"abc".to_vec()),
                Piece::Line(b"de".to_vec()),
                Piece::Line(Vec::new()),
                Piece::Line(b"f".to_vec()),
            ]
        );
    }

    #[test]
    fn a_line_at_the_bound_passes_and_one_past_it_is_dropped_once() {
        // RT-01
        assert_eq!(cut(4, &[b"abcd\n"]), vec![Piece::Line(b"abcd".to_vec())]);
        // One byte past the bound, arriving in pieces: dropped, told once, and the next
        // line is whole.
        let got = cut(4, &[b"ab", b"cde", b"fgh", b"ij\nok\n"]);
        assert_eq!(got, vec![Piece::TooLong, Piece::Line(b"ok".to_vec())]);
    }

    #[test]
    fn a_dropped_line_keeps_no_bytes() {
        let mut s = LineSplitter::new(8);
        let mut out = Vec::new();
        for _ in 0..1000 {
            s.push(&[b'x'; 1024], &mut out);
        }
        assert_eq!(out, vec![Piece::TooLong]);
        assert!(s.buf.capacity() <= 8, "kept {} bytes", s.buf.capacity());
    }
}
