//! The encoding the messages between skiffd's processes share (see
//! `pam_session_wire` and `worker_wire`): one message per datagram of a
//! `SOCK_SEQPACKET` socket, a tag byte, then the fields in order (numbers
//! big-endian, strings and byte strings with a 32-bit length, lists with a
//! 32-bit count). Pure: bounds-checked reading, no I/O.

/// Why a message could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("the message ends early")]
    Short,
    #[error("unknown message tag {0}")]
    Tag(u8),
    #[error("{0} bytes after the message")]
    Trailing(usize),
    #[error("a string is not UTF-8")]
    NotUtf8,
    #[error("a message of {0} bytes (at most {1})")]
    TooLong(usize, usize),
}

#[derive(Default)]
pub(crate) struct Writer(pub(crate) Vec<u8>);

impl Writer {
    pub(crate) fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    pub(crate) fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    pub(crate) fn i32(&mut self, v: i32) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    pub(crate) fn bytes(&mut self, b: &[u8]) {
        self.u32(b.len() as u32);
        self.0.extend_from_slice(b);
    }
    pub(crate) fn pairs(&mut self, pairs: &[(String, String)]) {
        self.u32(pairs.len() as u32);
        for (k, v) in pairs {
            self.bytes(k.as_bytes());
            self.bytes(v.as_bytes());
        }
    }
    pub(crate) fn strings(&mut self, list: &[String]) {
        self.u32(list.len() as u32);
        for s in list {
            self.bytes(s.as_bytes());
        }
    }
}

pub(crate) struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    /// A reader of `bytes`, refused when longer than `max`.
    pub(crate) fn checked(bytes: &'a [u8], max: usize) -> Result<Reader<'a>, WireError> {
        if bytes.len() > max {
            return Err(WireError::TooLong(bytes.len(), max));
        }
        Ok(Reader(bytes))
    }

    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if self.0.len() < n {
            return Err(WireError::Short);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    pub(crate) fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.take(1)?[0])
    }
    pub(crate) fn u32(&mut self) -> Result<u32, WireError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    pub(crate) fn i32(&mut self) -> Result<i32, WireError> {
        Ok(self.u32()? as i32)
    }
    pub(crate) fn bool(&mut self) -> Result<bool, WireError> {
        Ok(self.u8()? != 0)
    }
    pub(crate) fn bytes(&mut self) -> Result<Vec<u8>, WireError> {
        let n = self.u32()? as usize;
        Ok(self.take(n)?.to_vec())
    }
    pub(crate) fn string(&mut self) -> Result<String, WireError> {
        String::from_utf8(self.bytes()?).map_err(|_| WireError::NotUtf8)
    }
    /// A count of items each at least `min` bytes long, checked against
    /// what is left so that no count allocates more than the message.
    pub(crate) fn count(&mut self, min: usize) -> Result<usize, WireError> {
        let n = self.u32()? as usize;
        if n.saturating_mul(min) > self.0.len() {
            return Err(WireError::Short);
        }
        Ok(n)
    }
    pub(crate) fn pairs(&mut self) -> Result<Vec<(String, String)>, WireError> {
        let n = self.count(8)?;
        (0..n)
            .map(|_| Ok((self.string()?, self.string()?)))
            .collect()
    }
    pub(crate) fn strings(&mut self) -> Result<Vec<String>, WireError> {
        let n = self.count(4)?;
        (0..n).map(|_| self.string()).collect()
    }
    pub(crate) fn end(self) -> Result<(), WireError> {
        match self.0.len() {
            0 => Ok(()),
            n => Err(WireError::Trailing(n)),
        }
    }
}
