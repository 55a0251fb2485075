//! OpenSSH key revocation lists (KRLs, the binary format `ssh-keygen -k`
//! writes and sshd's `RevokedKeys` reads), parsed without I/O.
//!
//! A KRL revokes plain keys (by blob, SHA-1 or SHA-256 hash) and
//! certificates (by serial number, range, bitmap or key ID, per CA or for
//! every CA). Anything this parser does not understand is an error, never a
//! silent pass: a critical extension, a signature section (which OpenSSH
//! 9.4 and later refuse as well), an unknown section type, trailing bytes.
//! The caller then refuses every key, as sshd does with a KRL it cannot
//! load.

use std::collections::HashSet;

use sha1::Digest as _;

/// "SSHKRL\n\0".
pub const MAGIC: [u8; 8] = *b"SSHKRL\n\0";
const FORMAT_VERSION: u32 = 1;

const SECTION_CERTIFICATES: u8 = 1;
const SECTION_EXPLICIT_KEY: u8 = 2;
const SECTION_FINGERPRINT_SHA1: u8 = 3;
const SECTION_SIGNATURE: u8 = 4;
const SECTION_FINGERPRINT_SHA256: u8 = 5;
const SECTION_EXTENSION: u8 = 255;

const CERT_SERIAL_LIST: u8 = 0x20;
const CERT_SERIAL_RANGE: u8 = 0x21;
const CERT_SERIAL_BITMAP: u8 = 0x22;
const CERT_KEY_ID: u8 = 0x23;
const CERT_EXTENSION: u8 = 0x39;

/// Why a KRL could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KrlError {
    #[error("not a KRL (no SSHKRL magic)")]
    NotKrl,
    #[error("KRL format version {0} is not supported (only 1)")]
    Version(u32),
    #[error("truncated at byte {0}")]
    Truncated(usize),
    #[error("unknown section type {kind} at byte {at}")]
    UnknownSection { kind: u8, at: usize },
    #[error("unknown certificate subsection type {kind:#x} at byte {at}")]
    UnknownCertSection { kind: u8, at: usize },
    #[error("critical extension {0:?} is not supported")]
    CriticalExtension(String),
    #[error("signed KRLs are not supported (OpenSSH refuses them too); sign the file with ssh-keygen -Y instead")]
    Signed,
    #[error("bad {what} at byte {at}")]
    BadValue { what: &'static str, at: usize },
}

/// A certificate, as far as revocation is concerned.
#[derive(Debug, Clone, Copy)]
pub struct CertificateRef<'a> {
    /// The signing CA's public key blob.
    pub ca_key: &'a [u8],
    pub serial: u64,
    pub key_id: &'a str,
}

/// Revocations of certificates from one CA, or from any CA.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct CertRevocations {
    /// The CA's key blob; `None` for every CA.
    ca_key: Option<Vec<u8>>,
    /// Inclusive serial ranges (a listed serial is a range of one).
    serial_ranges: Vec<(u64, u64)>,
    /// Bitmaps: bit N (from the least significant end of the big-endian
    /// bytes) revokes serial `offset + N`.
    bitmaps: Vec<(u64, Vec<u8>)>,
    key_ids: HashSet<String>,
}

impl CertRevocations {
    fn revokes(&self, cert: &CertificateRef<'_>) -> bool {
        if self.ca_key.as_deref().is_some_and(|ca| ca != cert.ca_key) {
            return false;
        }
        let serial = cert.serial;
        self.key_ids.contains(cert.key_id)
            || self
                .serial_ranges
                .iter()
                .any(|&(lo, hi)| lo <= serial && serial <= hi)
            || self.bitmaps.iter().any(|(offset, bits)| {
                let Some(index) = serial.checked_sub(*offset) else {
                    return false;
                };
                let byte = index / 8;
                byte < bits.len() as u64
                    && bits[bits.len() - 1 - byte as usize] & (1 << (index % 8)) != 0
            })
    }
}

/// A parsed KRL.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Krl {
    pub version: u64,
    pub generated: u64,
    pub comment: String,
    explicit_keys: HashSet<Vec<u8>>,
    sha1: HashSet<Vec<u8>>,
    sha256: HashSet<Vec<u8>>,
    certificates: Vec<CertRevocations>,
}

impl Krl {
    /// Parses a whole KRL file.
    pub fn parse(bytes: &[u8]) -> Result<Krl, KrlError> {
        let mut r = Reader { buf: bytes, at: 0 };
        if r.take(8).ok() != Some(&MAGIC[..]) {
            return Err(KrlError::NotKrl);
        }
        let format = r.u32()?;
        if format != FORMAT_VERSION {
            return Err(KrlError::Version(format));
        }
        let mut krl = Krl {
            version: r.u64()?,
            generated: r.u64()?,
            ..Krl::default()
        };
        let _flags = r.u64()?;
        let _reserved = r.string()?;
        krl.comment = String::from_utf8_lossy(r.string()?).into_owned();
        while !r.is_empty() {
            let at = r.at;
            let kind = r.u8()?;
            if kind == SECTION_SIGNATURE {
                return Err(KrlError::Signed);
            }
            let data_at = r.at + 4;
            let mut data = Reader {
                buf: r.string()?,
                at: data_at,
            };
            match kind {
                SECTION_CERTIFICATES => krl.certificates.push(parse_cert_section(&mut data)?),
                SECTION_EXPLICIT_KEY => {
                    read_each(&mut data, |blob, _| {
                        krl.explicit_keys.insert(blob.to_vec());
                        Ok(())
                    })?;
                }
                SECTION_FINGERPRINT_SHA1 | SECTION_FINGERPRINT_SHA256 => {
                    let (set, len) = if kind == SECTION_FINGERPRINT_SHA1 {
                        (&mut krl.sha1, 20)
                    } else {
                        (&mut krl.sha256, 32)
                    };
                    read_each(&mut data, |hash, at| {
                        if hash.len() != len {
                            return Err(KrlError::BadValue {
                                what: "key hash length",
                                at,
                            });
                        }
                        set.insert(hash.to_vec());
                        Ok(())
                    })?;
                }
                SECTION_EXTENSION => extension(&mut data)?,
                _ => return Err(KrlError::UnknownSection { kind, at }),
            }
        }
        Ok(krl)
    }

    /// Whether the plain key `blob` is revoked (by blob or hash).
    pub fn revokes_key(&self, blob: &[u8]) -> bool {
        self.explicit_keys.contains(blob)
            || (!self.sha256.is_empty()
                && self.sha256.contains(sha2::Sha256::digest(blob).as_slice()))
            || (!self.sha1.is_empty() && self.sha1.contains(sha1::Sha1::digest(blob).as_slice()))
    }

    /// Whether a certificate is revoked by its serial or key ID, or because
    /// its CA key is revoked as a plain key.
    pub fn revokes_certificate(&self, cert: &CertificateRef<'_>) -> bool {
        self.certificates.iter().any(|c| c.revokes(cert)) || self.revokes_key(cert.ca_key)
    }
}

fn parse_cert_section(r: &mut Reader<'_>) -> Result<CertRevocations, KrlError> {
    let ca = r.string()?;
    let _reserved = r.string()?;
    let mut section = CertRevocations {
        ca_key: (!ca.is_empty()).then(|| ca.to_vec()),
        ..CertRevocations::default()
    };
    while !r.is_empty() {
        let at = r.at;
        let kind = r.u8()?;
        let data_at = r.at + 4;
        let mut data = Reader {
            buf: r.string()?,
            at: data_at,
        };
        match kind {
            CERT_SERIAL_LIST => {
                while !data.is_empty() {
                    let s = data.u64()?;
                    section.serial_ranges.push((s, s));
                }
            }
            CERT_SERIAL_RANGE => {
                let at = data.at;
                let (lo, hi) = (data.u64()?, data.u64()?);
                if lo > hi {
                    return Err(KrlError::BadValue {
                        what: "serial range (minimum above maximum)",
                        at,
                    });
                }
                section.serial_ranges.push((lo, hi));
                data.finish("serial range")?;
            }
            CERT_SERIAL_BITMAP => {
                let offset = data.u64()?;
                let at = data.at;
                let bits = data.string()?;
                if bits.first().is_some_and(|b| b & 0x80 != 0) {
                    return Err(KrlError::BadValue {
                        what: "serial bitmap (negative mpint)",
                        at,
                    });
                }
                section.bitmaps.push((offset, bits.to_vec()));
                data.finish("serial bitmap")?;
            }
            CERT_KEY_ID => {
                read_each(&mut data, |id, at| {
                    let id = std::str::from_utf8(id).map_err(|_| KrlError::BadValue {
                        what: "key ID (not UTF-8)",
                        at,
                    })?;
                    section.key_ids.insert(id.to_owned());
                    Ok(())
                })?;
            }
            CERT_EXTENSION => extension(&mut data)?,
            _ => return Err(KrlError::UnknownCertSection { kind, at }),
        }
    }
    Ok(section)
}

/// An extension (section or certificate subsection): skipped unless critical.
fn extension(r: &mut Reader<'_>) -> Result<(), KrlError> {
    let name = String::from_utf8_lossy(r.string()?).into_owned();
    let at = r.at;
    let critical = match r.u8()? {
        0 => false,
        1 => true,
        _ => {
            return Err(KrlError::BadValue {
                what: "extension criticality",
                at,
            })
        }
    };
    if critical {
        return Err(KrlError::CriticalExtension(name));
    }
    let _contents = r.string()?;
    r.finish("extension")
}

/// Calls `each` for every string in `r` (with where it starts); a section
/// of this kind must hold at least one.
fn read_each(
    r: &mut Reader<'_>,
    mut each: impl FnMut(&[u8], usize) -> Result<(), KrlError>,
) -> Result<(), KrlError> {
    if r.is_empty() {
        return Err(KrlError::BadValue {
            what: "empty section",
            at: r.at,
        });
    }
    while !r.is_empty() {
        let at = r.at;
        each(r.string()?, at)?;
    }
    Ok(())
}

/// Reads SSH wire fields, knowing its offset in the file for errors.
struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], KrlError> {
        if n > self.buf.len() {
            return Err(KrlError::Truncated(self.at + self.buf.len()));
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        self.at += n;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, KrlError> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, KrlError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self) -> Result<u64, KrlError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_be_bytes(a))
    }

    fn string(&mut self) -> Result<&'a [u8], KrlError> {
        let n = self.u32()? as usize;
        self.take(n)
    }

    /// Nothing may follow the fields of a fixed-size item.
    fn finish(&self, what: &'static str) -> Result<(), KrlError> {
        if self.is_empty() {
            Ok(())
        } else {
            Err(KrlError::BadValue { what, at: self.at })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds KRLs field by field, as `ssh-keygen -k` lays them out.
    #[derive(Default)]
    struct Builder(Vec<u8>);

    impl Builder {
        fn header() -> Builder {
            let mut b = Builder(MAGIC.to_vec());
            b.u32(1)
                .u64(7)
                .u64(1_700_000_000)
                .u64(0)
                .string(b"")
                .string(b"test krl");
            b
        }
        fn u32(&mut self, v: u32) -> &mut Self {
            self.0.extend_from_slice(&v.to_be_bytes());
            self
        }
        fn u64(&mut self, v: u64) -> &mut Self {
            self.0.extend_from_slice(&v.to_be_bytes());
            self
        }
        fn byte(&mut self, v: u8) -> &mut Self {
            self.0.push(v);
            self
        }
        fn string(&mut self, s: &[u8]) -> &mut Self {
            self.u32(s.len() as u32);
            self.0.extend_from_slice(s);
            self
        }
        fn section(&mut self, kind: u8, body: &Builder) -> &mut Self {
            self.byte(kind).string(&body.0)
        }
    }

    fn strings(items: &[&[u8]]) -> Builder {
        let mut b = Builder::default();
        for i in items {
            b.string(i);
        }
        b
    }

    const CA: &[u8] = b"ca-key-blob";
    const OTHER_CA: &[u8] = b"other-ca-blob";

    fn cert(ca: &'static [u8], serial: u64, id: &'static str) -> CertificateRef<'static> {
        CertificateRef {
            ca_key: ca,
            serial,
            key_id: id,
        }
    }

    #[test]
    fn header_only() {
        let krl = Krl::parse(&Builder::header().0).unwrap();
        assert_eq!((krl.version, krl.comment.as_str()), (7, "test krl"));
        assert!(!krl.revokes_key(b"anything"));
    }

    #[test]
    fn keys_by_blob_and_hash() {
        let sha256 = sha2::Sha256::digest(b"key-two").to_vec();
        let sha1 = sha1::Sha1::digest(b"key-three").to_vec();
        let mut b = Builder::header();
        b.section(SECTION_EXPLICIT_KEY, &strings(&[b"key-one"]))
            .section(SECTION_FINGERPRINT_SHA256, &strings(&[&sha256]))
            .section(SECTION_FINGERPRINT_SHA1, &strings(&[&sha1]));
        let krl = Krl::parse(&b.0).unwrap();
        for k in [&b"key-one"[..], b"key-two", b"key-three"] {
            assert!(krl.revokes_key(k), "{k:?}");
        }
        assert!(!krl.revokes_key(b"key-four"));
        // A CA revoked as a key revokes what it signed.
        assert!(krl.revokes_certificate(&cert(b"key-one", 1, "x")));
    }

    /// A certificates section for [`CA`]: serials 5 and 9, 100 to 200, and
    /// a bitmap of 1000 and 1009.
    fn serials_section() -> Builder {
        let mut serials = Builder::default();
        serials.u64(5).u64(9);
        let mut range = Builder::default();
        range.u64(100).u64(200);
        // Bits 0 and 9 of 0x0201: serials 1000 and 1009.
        let mut bitmap = Builder::default();
        bitmap.u64(1000).string(&[0x02, 0x01]);
        let mut section = Builder::default();
        section
            .string(CA)
            .string(b"")
            .section(CERT_SERIAL_LIST, &serials)
            .section(CERT_SERIAL_RANGE, &range)
            .section(CERT_SERIAL_BITMAP, &bitmap);
        section
    }

    #[test]
    fn certificates_by_serial_range_bitmap_and_id() {
        let section = serials_section();
        let mut any_ca = Builder::default();
        any_ca
            .string(b"")
            .string(b"")
            .section(CERT_KEY_ID, &strings(&[b"lost-laptop"]));
        let mut b = Builder::header();
        b.section(SECTION_CERTIFICATES, &section)
            .section(SECTION_CERTIFICATES, &any_ca);
        let krl = Krl::parse(&b.0).unwrap();
        for serial in [5, 9, 100, 150, 200, 1000, 1009] {
            assert!(krl.revokes_certificate(&cert(CA, serial, "a")), "{serial}");
            // Serials belong to their CA.
            assert!(
                !krl.revokes_certificate(&cert(OTHER_CA, serial, "a")),
                "{serial}"
            );
        }
        for serial in [0, 4, 6, 99, 201, 999, 1001, 1008, 1010, 1016, u64::MAX] {
            assert!(!krl.revokes_certificate(&cert(CA, serial, "a")), "{serial}");
        }
        // A key ID revoked for every CA.
        assert!(krl.revokes_certificate(&cert(OTHER_CA, 3, "lost-laptop")));
    }

    #[test]
    fn what_is_not_understood_is_an_error() {
        assert_eq!(Krl::parse(b"ssh-ed25519 AAAA"), Err(KrlError::NotKrl));
        let mut v2 = Builder(MAGIC.to_vec());
        v2.u32(2);
        assert_eq!(Krl::parse(&v2.0), Err(KrlError::Version(2)));
        let whole = {
            let mut b = Builder::header();
            b.section(SECTION_EXPLICIT_KEY, &strings(&[b"key-one"]));
            b.0
        };
        // Cut anywhere but at the end of the header (a KRL of no sections).
        let header = Builder::header().0.len();
        for cut in (0..whole.len()).filter(|&c| c != header) {
            assert!(Krl::parse(&whole[..cut]).is_err(), "cut at {cut}");
        }
        let mut signed = Builder::header();
        signed.byte(SECTION_SIGNATURE).string(b"k").string(b"s");
        assert_eq!(Krl::parse(&signed.0), Err(KrlError::Signed));
        let mut unknown = Builder::header();
        unknown.section(9, &Builder::default());
        assert!(matches!(
            Krl::parse(&unknown.0),
            Err(KrlError::UnknownSection { kind: 9, .. })
        ));
        let mut empty = Builder::header();
        empty.section(SECTION_EXPLICIT_KEY, &Builder::default());
        assert!(Krl::parse(&empty.0).is_err());
        let mut bad_hash = Builder::header();
        bad_hash.section(SECTION_FINGERPRINT_SHA256, &strings(&[b"short"]));
        assert!(Krl::parse(&bad_hash.0).is_err());
        let mut backwards = Builder::default();
        backwards.u64(9).u64(3);
        let mut section = Builder::default();
        section
            .string(CA)
            .string(b"")
            .section(CERT_SERIAL_RANGE, &backwards);
        let mut b = Builder::header();
        b.section(SECTION_CERTIFICATES, &section);
        assert!(Krl::parse(&b.0).is_err());
    }

    /// Every single-byte change of a KRL with every kind of section parses
    /// or fails cleanly, and a parsed result answers queries.
    #[test]
    fn corrupted_lists_never_panic() {
        let mut section = serials_section();
        section.section(CERT_KEY_ID, &strings(&[b"id"]));
        let mut b = Builder::header();
        b.section(SECTION_CERTIFICATES, &section)
            .section(SECTION_EXPLICIT_KEY, &strings(&[b"key-one"]))
            .section(SECTION_FINGERPRINT_SHA256, &strings(&[&[7u8; 32]]));
        let whole = b.0;
        for at in 0..whole.len() {
            for value in [0u8, 1, 0x7f, 0x80, 0xff] {
                let mut bytes = whole.clone();
                bytes[at] = value;
                if let Ok(krl) = Krl::parse(&bytes) {
                    let _ = krl.revokes_key(b"key-one");
                    let _ = krl.revokes_certificate(&cert(CA, 1000, "id"));
                    let _ = krl.revokes_certificate(&cert(CA, u64::MAX, "x"));
                }
            }
        }
    }

    #[test]
    fn extensions_are_skipped_unless_critical() {
        let ext = |critical: u8| {
            let mut e = Builder::default();
            e.string(b"bloom-explicit-key@example")
                .byte(critical)
                .string(b"contents");
            e
        };
        let mut b = Builder::header();
        b.section(SECTION_EXTENSION, &ext(0))
            .section(SECTION_EXPLICIT_KEY, &strings(&[b"key-one"]));
        assert!(Krl::parse(&b.0).unwrap().revokes_key(b"key-one"));
        let mut b = Builder::header();
        b.section(SECTION_EXTENSION, &ext(1));
        assert!(matches!(
            Krl::parse(&b.0),
            Err(KrlError::CriticalExtension(_))
        ));
        let mut section = Builder::default();
        section
            .string(b"")
            .string(b"")
            .section(CERT_EXTENSION, &ext(1));
        let mut b = Builder::header();
        b.section(SECTION_CERTIFICATES, &section);
        assert!(matches!(
            Krl::parse(&b.0),
            Err(KrlError::CriticalExtension(_))
        ));
    }
}
