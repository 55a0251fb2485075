//! The OpenSSH private-key container (`openssh-key-v1`), taken apart and
//! rebuilt, to repair one thing: an ECDSA private scalar that OpenSSH wrote
//! as a minimal `mpint`, shorter than its field when its top byte is zero
//! (one P-256 key in 256). The decoder skiff uses refuses such a key, so
//! [`widen_ecdsa_scalar`] rewrites the scalar at its full width, with the
//! same value. Bytes in, bytes out: decryption is the caller's.

/// What the container holds, the private section as stored (encrypted or
/// not).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Container<'a> {
    pub cipher: &'a [u8],
    pub kdf: &'a [u8],
    pub kdf_options: &'a [u8],
    pub public_key: &'a [u8],
    pub private_section: &'a [u8],
}

const MAGIC: &[u8] = b"openssh-key-v1\0";

/// Reads SSH strings and integers off the front of a byte slice.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn u32(&mut self) -> Option<u32> {
        let (head, rest) = self.0.split_first_chunk::<4>()?;
        self.0 = rest;
        Some(u32::from_be_bytes(*head))
    }

    fn string(&mut self) -> Option<&'a [u8]> {
        let len = usize::try_from(self.u32()?).ok()?;
        if len > self.0.len() {
            return None;
        }
        let (s, rest) = self.0.split_at(len);
        self.0 = rest;
        Some(s)
    }
}

fn put_string(out: &mut Vec<u8>, s: &[u8]) {
    let len = u32::try_from(s.len()).expect("key fields are far below 4 GiB");
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(s);
}

/// The container's parts; `None` when `bytes` is not one container holding
/// one key.
pub fn parse(bytes: &[u8]) -> Option<Container<'_>> {
    let mut r = Reader(bytes.strip_prefix(MAGIC)?);
    let cipher = r.string()?;
    let kdf = r.string()?;
    let kdf_options = r.string()?;
    if r.u32()? != 1 {
        return None;
    }
    let public_key = r.string()?;
    let private_section = r.string()?;
    Some(Container {
        cipher,
        kdf,
        kdf_options,
        public_key,
        private_section,
    })
}

/// An unencrypted container for `public_key` and the plaintext
/// `private_section` (whose padding must suit a block of 8).
pub fn unencrypted(public_key: &[u8], private_section: &[u8]) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    put_string(&mut out, b"none");
    put_string(&mut out, b"none");
    put_string(&mut out, b"");
    out.extend_from_slice(&1u32.to_be_bytes());
    put_string(&mut out, public_key);
    put_string(&mut out, private_section);
    out
}

/// The bytes inside an `-----BEGIN OPENSSH PRIVATE KEY-----` armour.
pub fn armored_body(text: &str) -> Option<Vec<u8>> {
    use base64::Engine as _;
    let mut lines = text.lines().map(str::trim);
    lines.find(|l| *l == "-----BEGIN OPENSSH PRIVATE KEY-----")?;
    let mut body = String::new();
    for line in lines {
        if line == "-----END OPENSSH PRIVATE KEY-----" {
            return base64::engine::general_purpose::STANDARD.decode(body).ok();
        }
        body.push_str(line);
    }
    None
}

/// An unencrypted container (`bytes`) rebuilt with its ECDSA scalar at full
/// width; `None` when it is encrypted or has nothing to repair.
pub fn repair_unencrypted(bytes: &[u8]) -> Option<Vec<u8>> {
    let c = parse(bytes)?;
    if c.cipher != b"none" {
        return None;
    }
    let section = widen_ecdsa_scalar(c.private_section)?;
    Some(unencrypted(c.public_key, &section))
}

/// The width of an ECDSA key type's private scalar, in bytes.
fn scalar_width(key_type: &[u8]) -> Option<usize> {
    match key_type {
        b"ecdsa-sha2-nistp256" => Some(32),
        b"ecdsa-sha2-nistp384" => Some(48),
        b"ecdsa-sha2-nistp521" => Some(66),
        _ => None,
    }
}

/// A plaintext private section whose ECDSA scalar is shorter than its field,
/// rewritten with the scalar zero-extended to the field's width and the
/// padding redone for a block of 8. `None`: not an ECDSA key, a scalar
/// already full width, or not a well-formed plaintext section (which is
/// what a wrong passphrase gives).
pub fn widen_ecdsa_scalar(section: &[u8]) -> Option<Vec<u8>> {
    let mut r = Reader(section);
    let (check1, check2) = (r.u32()?, r.u32()?);
    if check1 != check2 {
        return None;
    }
    let key_type = r.string()?;
    let width = scalar_width(key_type)?;
    let curve = r.string()?;
    let point = r.string()?;
    let scalar = r.string()?;
    let comment = r.string()?;
    // Padding to the cipher's block (at most 16 bytes): 1, 2, 3, ...
    let padding_ok = r.0.len() < 16 && r.0.iter().zip(1u8..).all(|(&b, n)| b == n);
    if scalar.len() >= width || !padding_ok {
        return None;
    }
    let mut out = Vec::with_capacity(section.len() + 8);
    out.extend_from_slice(&check1.to_be_bytes());
    out.extend_from_slice(&check2.to_be_bytes());
    put_string(&mut out, key_type);
    put_string(&mut out, curve);
    put_string(&mut out, point);
    let mut wide = vec![0u8; width - scalar.len()];
    wide.extend_from_slice(scalar);
    put_string(&mut out, &wide);
    put_string(&mut out, comment);
    for n in 1u8.. {
        if out.len() % 8 == 0 {
            break;
        }
        out.push(n);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(key_type: &[u8], scalar: &[u8], comment: &[u8]) -> Vec<u8> {
        let mut s = Vec::new();
        s.extend_from_slice(&0x1234_5678u32.to_be_bytes());
        s.extend_from_slice(&0x1234_5678u32.to_be_bytes());
        put_string(&mut s, key_type);
        put_string(&mut s, b"nistp256");
        put_string(&mut s, &[4; 65]);
        put_string(&mut s, scalar);
        put_string(&mut s, comment);
        for n in 1u8.. {
            if s.len() % 8 == 0 {
                break;
            }
            s.push(n);
        }
        s
    }

    #[test]
    fn a_short_p256_scalar_is_widened_with_the_same_value() {
        let short: Vec<u8> = (1..=31).collect();
        let fixed = widen_ecdsa_scalar(&section(b"ecdsa-sha2-nistp256", &short, b"me@host"))
            .expect("a 31-byte scalar is widened");
        let mut wide = vec![0];
        wide.extend_from_slice(&short);
        assert_eq!(
            fixed,
            section(b"ecdsa-sha2-nistp256", &wide, b"me@host"),
            "zero-extended, everything else kept, padding redone"
        );
        assert_eq!(fixed.len() % 8, 0);
        // Two zero bytes on top (one key in 65,536) as well.
        let shorter: Vec<u8> = (1..=30).collect();
        let fixed = widen_ecdsa_scalar(&section(b"ecdsa-sha2-nistp256", &shorter, b"")).unwrap();
        assert!(fixed
            .windows(4 + 32)
            .any(|w| w[..4] == 32u32.to_be_bytes() && w[4..6] == [0, 0] && w[6..] == shorter[..]));
    }

    #[test]
    fn nothing_else_is_touched() {
        let full: Vec<u8> = (1..=32).collect();
        assert_eq!(
            widen_ecdsa_scalar(&section(b"ecdsa-sha2-nistp256", &full, b"c")),
            None
        );
        let with_sign_byte: Vec<u8> = std::iter::once(0).chain(0x80..0xa0).collect();
        assert_eq!(
            widen_ecdsa_scalar(&section(b"ecdsa-sha2-nistp256", &with_sign_byte, b"c")),
            None
        );
        assert_eq!(
            widen_ecdsa_scalar(&section(b"ssh-ed25519", &[1; 31], b"c")),
            None
        );
        // What a wrong passphrase decrypts to: check words that differ.
        let mut garbled = section(b"ecdsa-sha2-nistp256", &[1; 31], b"c");
        garbled[0] ^= 1;
        assert_eq!(widen_ecdsa_scalar(&garbled), None);
        // Truncated anywhere: refused, never a panic.
        let good = section(b"ecdsa-sha2-nistp256", &[1; 31], b"c");
        for cut in 0..good.len() {
            let _ = widen_ecdsa_scalar(&good[..cut]);
        }
    }

    #[test]
    fn unencrypted_containers_are_repaired_and_encrypted_ones_left() {
        let short = section(b"ecdsa-sha2-nistp256", &[7; 31], b"c");
        let built = unencrypted(b"PUBLIC", &short);
        let repaired = repair_unencrypted(&built).expect("repaired");
        let c = parse(&repaired).unwrap();
        assert_eq!(c.public_key, b"PUBLIC");
        assert_eq!(Some(c.private_section.to_vec()), widen_ecdsa_scalar(&short));
        assert_eq!(
            repair_unencrypted(&repaired),
            None,
            "nothing left to repair"
        );
        let mut encrypted = MAGIC.to_vec();
        put_string(&mut encrypted, b"aes256-ctr");
        encrypted.extend_from_slice(&built[MAGIC.len() + 8..]);
        assert_eq!(parse(&encrypted).unwrap().cipher, b"aes256-ctr");
        assert_eq!(repair_unencrypted(&encrypted), None);
    }

    #[test]
    fn the_armour_is_taken_off() {
        use base64::Engine as _;
        let bytes = unencrypted(b"P", b"S");
        let b64 = base64::engine::general_purpose::STANDARD.encode(&bytes);
        let (a, b) = b64.split_at(20);
        let text = format!(
            "-----BEGIN OPENSSH PRIVATE KEY-----\n{a}\n{b}\n-----END OPENSSH PRIVATE KEY-----\n"
        );
        assert_eq!(armored_body(&text), Some(bytes));
        assert_eq!(armored_body(&text.replace("-----END", "-----FIN")), None);
        assert_eq!(armored_body("-----BEGIN RSA PRIVATE KEY-----\n"), None);
    }

    #[test]
    fn containers_round_trip() {
        let built = unencrypted(b"PUBLIC", b"PRIVATE");
        let c = parse(&built).expect("parses");
        assert_eq!(c.cipher, b"none");
        assert_eq!(c.kdf, b"none");
        assert_eq!(c.kdf_options, b"");
        assert_eq!(c.public_key, b"PUBLIC");
        assert_eq!(c.private_section, b"PRIVATE");
        assert_eq!(parse(b"openssh-key-v2\0"), None);
        for cut in 0..built.len() {
            assert_eq!(parse(&built[..cut]), None, "cut at {cut}");
        }
    }
}
