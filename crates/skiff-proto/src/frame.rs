//! Length-prefixed binary frames shared by skiff's own protocols (the agent
//! protocol and the data plane's control messages): a `u32` big-endian body
//! length, then the body, a `u8` tag and fields. Integers are big-endian,
//! strings and byte strings carry a `u32` length, and every length and count
//! is checked against the bytes left, so a hostile peer cannot cause a large
//! allocation.

/// The largest frame body (the bytes after the 4-byte length prefix) a
/// decoder accepts.
pub const MAX_FRAME: usize = 1 << 20;

/// Length of the frame header (the big-endian body length).
pub(crate) const HEADER: usize = 4;

/// Why a buffer could not be decoded. Any of these means the stream is
/// unusable: the reader should drop the connection.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WireError {
    /// A field runs past the end of its (complete) frame, or the frame body is empty.
    #[error("malformed frame: a field runs past the end of the frame")]
    Truncated,
    /// A declared frame body length exceeds [`MAX_FRAME`].
    #[error("frame too large: {0} bytes (limit {MAX_FRAME})")]
    TooLarge(usize),
    /// The message tag is not known.
    #[error("unknown message tag {0}")]
    UnknownTag(u8),
    /// A string field is not valid UTF-8.
    #[error("frame holds a string that is not valid UTF-8")]
    BadUtf8,
    /// Bytes were left in the frame after its last field.
    #[error("frame has {0} trailing bytes after its fields")]
    Trailing(usize),
    /// A field holds a value outside its domain (e.g. a bool that is not 0 or 1).
    #[error("frame holds an invalid {0}")]
    BadValue(&'static str),
}

/// Builds one frame: reserves the length prefix and patches it at the end.
pub(crate) struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    pub(crate) fn new(tag: u8) -> Self {
        let mut buf = Vec::with_capacity(64);
        buf.extend_from_slice(&[0; HEADER]);
        buf.push(tag);
        Writer { buf }
    }

    pub(crate) fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }

    pub(crate) fn u16(&mut self, v: u16) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }

    pub(crate) fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }

    pub(crate) fn i32(&mut self, v: i32) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }

    pub(crate) fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }

    /// Bytes with no length prefix (fixed-size fields).
    pub(crate) fn raw(&mut self, b: &[u8]) {
        self.buf.extend_from_slice(b);
    }

    pub(crate) fn bytes(&mut self, b: &[u8]) {
        self.len(b.len());
        self.buf.extend_from_slice(b);
    }

    pub(crate) fn bool(&mut self, v: bool) {
        self.u8(u8::from(v));
    }

    /// A length or count. Anything that does not fit in a u32 cannot fit in a
    /// frame either; it is clamped and the decoder will refuse the frame.
    pub(crate) fn len(&mut self, n: usize) {
        self.u32(u32::try_from(n).unwrap_or(u32::MAX));
    }

    pub(crate) fn str(&mut self, s: &str) {
        self.len(s.len());
        self.buf.extend_from_slice(s.as_bytes());
    }

    pub(crate) fn opt_str(&mut self, s: Option<&str>) {
        match s {
            None => self.u8(0),
            Some(s) => {
                self.u8(1);
                self.str(s);
            }
        }
    }

    pub(crate) fn strs(&mut self, v: &[String]) {
        self.len(v.len());
        for s in v {
            self.str(s);
        }
    }

    pub(crate) fn pairs(&mut self, v: &[(String, String)]) {
        self.len(v.len());
        for (a, b) in v {
            self.str(a);
            self.str(b);
        }
    }

    /// Patches the length prefix and returns the frame.
    pub(crate) fn finish(mut self) -> Vec<u8> {
        let body = self.buf.len() - HEADER;
        let n = u32::try_from(body).unwrap_or(u32::MAX);
        self.buf[..HEADER].copy_from_slice(&n.to_be_bytes());
        self.buf
    }
}

/// Reads fields from one complete frame body.
pub(crate) struct Reader<'a> {
    pub(crate) buf: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn remaining(&self) -> usize {
        self.buf.len()
    }

    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if n > self.buf.len() {
            return Err(WireError::Truncated);
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    pub(crate) fn array<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.array::<1>()?[0])
    }

    pub(crate) fn u16(&mut self) -> Result<u16, WireError> {
        Ok(u16::from_be_bytes(self.array()?))
    }

    pub(crate) fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_be_bytes(self.array()?))
    }

    pub(crate) fn i32(&mut self) -> Result<i32, WireError> {
        Ok(i32::from_be_bytes(self.array()?))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_be_bytes(self.array()?))
    }

    pub(crate) fn bytes(&mut self) -> Result<Vec<u8>, WireError> {
        let n = self.u32()? as usize;
        Ok(self.take(n)?.to_vec())
    }

    pub(crate) fn bool(&mut self, what: &'static str) -> Result<bool, WireError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(WireError::BadValue(what)),
        }
    }

    /// An Option's presence flag.
    pub(crate) fn present(&mut self, what: &'static str) -> Result<bool, WireError> {
        self.bool(what)
    }

    pub(crate) fn str(&mut self) -> Result<String, WireError> {
        let n = self.u32()? as usize;
        let bytes = self.take(n)?;
        std::str::from_utf8(bytes)
            .map(str::to_owned)
            .map_err(|_| WireError::BadUtf8)
    }

    pub(crate) fn opt_str(&mut self, what: &'static str) -> Result<Option<String>, WireError> {
        if self.present(what)? {
            Ok(Some(self.str()?))
        } else {
            Ok(None)
        }
    }

    /// Reads a count of items that each take at least `min_item` bytes, and
    /// refuses counts the rest of the frame cannot possibly hold.
    pub(crate) fn count(&mut self, min_item: usize) -> Result<usize, WireError> {
        let n = self.u32()? as usize;
        if n > self.remaining() / min_item {
            return Err(WireError::Truncated);
        }
        Ok(n)
    }

    pub(crate) fn strs(&mut self) -> Result<Vec<String>, WireError> {
        let n = self.count(4)?;
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            v.push(self.str()?);
        }
        Ok(v)
    }

    pub(crate) fn pairs(&mut self) -> Result<Vec<(String, String)>, WireError> {
        let n = self.count(8)?;
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            let a = self.str()?;
            let b = self.str()?;
            v.push((a, b));
        }
        Ok(v)
    }

    /// Fails if anything is left in the frame.
    pub(crate) fn end(&self) -> Result<(), WireError> {
        match self.remaining() {
            0 => Ok(()),
            n => Err(WireError::Trailing(n)),
        }
    }
}

/// Splits off one complete frame body from the front of `buf`.
///
/// `Ok(None)`: more bytes are needed. `Ok(Some((body, consumed)))`: the body
/// (tag and fields) and the frame's total size. The size limit is checked as
/// soon as the prefix is available.
pub(crate) fn split_frame(buf: &[u8]) -> Result<Option<(&[u8], usize)>, WireError> {
    let Some(prefix) = buf.get(..HEADER) else {
        return Ok(None);
    };
    let mut len = [0u8; HEADER];
    len.copy_from_slice(prefix);
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(WireError::TooLarge(len));
    }
    let total = HEADER + len;
    match buf.get(HEADER..total) {
        None => Ok(None),
        Some(body) => Ok(Some((body, total))),
    }
}
