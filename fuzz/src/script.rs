//! The byte format every fuzz target reads its input from, and the writer the corpus
//! generator produces it with.
//!
//! An input is a script: a run of small fields read front to back from one
//! [`arbitrary::Unstructured`]. Numbers are little-endian and fixed width; a text is a
//! `u16` little-endian length followed by that many bytes; structured values (a block, a
//! chunk) come from `Arbitrary` derives over fixed-width fields. Past the end every read
//! gives zeros or an empty text, so every byte string is a valid script and a script
//! always ends.
//!
//! The format is fixed here and nowhere else, so [`ScriptWriter`] can write exactly what
//! [`Script`] reads: the seed corpus holds real answers in the places a fuzzer would have
//! to guess them.

use std::borrow::Cow;

use arbitrary::{Arbitrary, Unstructured};

/// Reads the fields of one fuzz input.
pub struct Script<'a> {
    u: Unstructured<'a>,
}

impl<'a> Script<'a> {
    /// A script over `data`.
    pub fn new(data: &'a [u8]) -> Script<'a> {
        Script {
            u: Unstructured::new(data),
        }
    }

    /// True when every byte was read.
    pub fn is_empty(&self) -> bool {
        self.u.is_empty()
    }

    fn fixed<const N: usize>(&mut self) -> [u8; N] {
        let mut buf = [0u8; N];
        // Past the end the buffer stays zero-filled, which is a valid value.
        if self.u.fill_buffer(&mut buf).is_err() {
            buf = [0u8; N];
        }
        buf
    }

    /// One byte (0 past the end).
    pub fn byte(&mut self) -> u8 {
        self.fixed::<1>()[0]
    }

    /// One of `n` choices (`n` must be at least 1).
    pub fn pick(&mut self, n: u8) -> u8 {
        self.byte() % n.max(1)
    }

    /// A flag.
    pub fn flag(&mut self) -> bool {
        self.byte() & 1 == 1
    }

    /// A little-endian `u16`.
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.fixed::<2>())
    }

    /// A little-endian `u32`.
    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.fixed::<4>())
    }

    /// A little-endian `u64`.
    pub fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.fixed::<8>())
    }

    /// A number that is small most of the time and sometimes sits at the top of the
    /// range, where sums and successors overflow: one byte selects the form.
    pub fn edgy_u64(&mut self) -> u64 {
        match self.pick(4) {
            0 | 1 => u64::from(self.byte()),
            2 => u64::MAX - u64::from(self.byte()),
            _ => self.u64(),
        }
    }

    /// A length-prefixed text, as bytes (shorter when the input ends first).
    pub fn bytes(&mut self) -> &'a [u8] {
        let len = usize::from(self.u16()).min(self.u.len());
        self.u.bytes(len).unwrap_or_default()
    }

    /// A length-prefixed text, invalid UTF-8 replaced.
    pub fn text(&mut self) -> Cow<'a, str> {
        String::from_utf8_lossy(self.bytes())
    }

    /// A structured value from its `Arbitrary` derive.
    pub fn value<T: Arbitrary<'a> + Default>(&mut self) -> T {
        T::arbitrary(&mut self.u).unwrap_or_default()
    }

    /// Every byte not read yet.
    pub fn rest(self) -> &'a [u8] {
        self.u.take_rest()
    }
}

/// Writes scripts in the format [`Script`] reads.
#[derive(Clone, Debug, Default)]
pub struct ScriptWriter {
    out: Vec<u8>,
}

impl ScriptWriter {
    /// An empty script.
    pub fn new() -> ScriptWriter {
        ScriptWriter::default()
    }

    /// One byte (an operation or a choice).
    pub fn byte(&mut self, b: u8) -> &mut Self {
        self.out.push(b);
        self
    }

    /// A little-endian `u16`.
    pub fn u16(&mut self, n: u16) -> &mut Self {
        self.out.extend_from_slice(&n.to_le_bytes());
        self
    }

    /// A little-endian `u32`.
    pub fn u32(&mut self, n: u32) -> &mut Self {
        self.out.extend_from_slice(&n.to_le_bytes());
        self
    }

    /// A little-endian `u64`.
    pub fn u64(&mut self, n: u64) -> &mut Self {
        self.out.extend_from_slice(&n.to_le_bytes());
        self
    }

    /// A length-prefixed text; texts longer than `u16::MAX` bytes are cut there.
    pub fn text(&mut self, t: impl AsRef<[u8]>) -> &mut Self {
        let t = t.as_ref();
        let t = &t[..t.len().min(usize::from(u16::MAX))];
        // The cut above keeps the length within u16.
        self.u16(u16::try_from(t.len()).unwrap_or(u16::MAX));
        self.out.extend_from_slice(t);
        self
    }

    /// Raw bytes (the rest of a script).
    pub fn raw(&mut self, t: impl AsRef<[u8]>) -> &mut Self {
        self.out.extend_from_slice(t.as_ref());
        self
    }

    /// The script.
    pub fn finish(&self) -> Vec<u8> {
        self.out.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_writer_writes_what_the_reader_reads() {
        let data = ScriptWriter::new()
            .byte(7)
            .u16(513)
            .u32(70_000)
            .u64(u64::MAX - 1)
            .text("héllo")
            .raw("tail")
            .finish();
        let mut s = Script::new(&data);
        assert_eq!(s.byte(), 7);
        assert_eq!(s.u16(), 513);
        assert_eq!(s.u32(), 70_000);
        assert_eq!(s.u64(), u64::MAX - 1);
        assert_eq!(s.text(), "héllo");
        assert_eq!(s.rest(), b"tail");
    }

    #[test]
    fn reads_past_the_end_give_zeros_and_empty_texts() {
        let mut s = Script::new(&[5, 0xff]);
        assert_eq!(s.byte(), 5);
        assert_eq!(s.bytes(), b"");
        assert_eq!(s.u64(), 0);
        assert!(s.is_empty());
    }
}
