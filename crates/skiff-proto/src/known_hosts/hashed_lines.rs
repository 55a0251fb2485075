//! Finding the hashed known_hosts lines that hide a given host name.
//!
//! A hashed line stores `HMAC-SHA1(salt, name)` under a salt of its own, so
//! the only way to find the lines for a name is to compute that HMAC once per
//! hashed line. A process pays this the first time it looks a name up, and
//! the cost grows with the file. Two things keep it small:
//!
//! * Each line's HMAC key is absorbed when the file is indexed. The SHA-1
//!   states after the key block XOR ipad and XOR opad are kept
//!   ([`KeyedSha1`]), so a name up to 55 bytes costs two SHA-1 compressions
//!   per line instead of four.
//! * Lines are stored in blocks of [`LANES`], one line per 32-bit lane, and a
//!   block's compressions run side by side in vector registers. The name's
//!   message schedule is the same for every line and is computed once per
//!   lookup. The lane code is plain Rust that the compiler vectorises; on
//!   x86-64 it is also compiled with AVX-512 and with AVX2 enabled, and the
//!   best one the CPU has is picked at run time.
//!
//! Nothing here does I/O, and every level is tested against the `hmac` crate.

use std::fmt;

use sha1::block_api::compress as sha1_compress;

use super::SHA1_LEN;

/// SHA-1 block size, which is also HMAC's padded key length.
const SHA1_BLOCK: usize = 64;

/// A SHA-1 chaining state (the five big-endian words of a digest).
pub(super) type Sha1State = [u32; 5];

/// SHA-1's initial state (FIPS 180-4, 5.3.1).
const SHA1_INIT: Sha1State = [
    0x6745_2301,
    0xefcd_ab89,
    0x98ba_dcfe,
    0x1032_5476,
    0xc3d2_e1f0,
];

/// SHA-1's round constants, one per group of 20 rounds.
const ROUND_CONSTANTS: [u32; 4] = [0x5a82_7999, 0x6ed9_eba1, 0x8f1b_bcdc, 0xca62_c1d6];

/// Length in bits of what the outer hash of an HMAC-SHA1 covers: the key
/// block and the 20-byte inner digest.
const OUTER_BITS: u32 = ((SHA1_BLOCK + SHA1_LEN) * 8) as u32;

/// A 20-byte digest as SHA-1 state words.
pub(super) fn sha1_words(digest: &[u8; SHA1_LEN]) -> Sha1State {
    let mut words = [0u32; 5];
    for (w, bytes) in words.iter_mut().zip(digest.chunks_exact(4)) {
        *w = u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    }
    words
}

/// HMAC-SHA1 (RFC 2104) with a 20-byte key already absorbed: the SHA-1
/// states after the key block XOR ipad and XOR opad.
#[derive(Clone, Copy)]
pub(super) struct KeyedSha1 {
    inner: Sha1State,
    outer: Sha1State,
}

impl KeyedSha1 {
    pub(super) fn new(key: &[u8; SHA1_LEN]) -> Self {
        let mut ipad = [0x36u8; SHA1_BLOCK];
        let mut opad = [0x5cu8; SHA1_BLOCK];
        for (i, k) in key.iter().enumerate() {
            ipad[i] ^= k;
            opad[i] ^= k;
        }
        let mut inner = SHA1_INIT;
        sha1_compress(&mut inner, &[ipad]);
        let mut outer = SHA1_INIT;
        sha1_compress(&mut outer, &[opad]);
        KeyedSha1 { inner, outer }
    }

    /// HMAC-SHA1(key, name), as state words, one line at a time.
    pub(super) fn mac(&self, name: &PaddedName) -> Sha1State {
        let mut inner = self.inner;
        sha1_compress(&mut inner, &name.blocks);
        let mut block = [0u8; SHA1_BLOCK];
        for (bytes, word) in block.chunks_exact_mut(4).zip(outer_message(inner)) {
            bytes.copy_from_slice(&word.to_be_bytes());
        }
        let mut outer = self.outer;
        sha1_compress(&mut outer, &[block]);
        outer
    }
}

/// The one block the outer hash compresses after the key block: the inner
/// digest, `0x80`, zeros and the bit length, as 16 message words.
fn outer_message(inner: Sha1State) -> [u32; 16] {
    let mut words = [0u32; 16];
    words[..5].copy_from_slice(&inner);
    words[5] = 0x8000_0000;
    words[15] = OUTER_BITS;
    words
}

/// A lookup name as the SHA-1 blocks that follow one key block: the name,
/// `0x80`, zeros and the bit length of key block plus name.
pub(super) struct PaddedName {
    blocks: Vec<[u8; SHA1_BLOCK]>,
}

impl PaddedName {
    pub(super) fn new(name: &str) -> Self {
        let name = name.as_bytes();
        let count = (name.len() + 9).div_ceil(SHA1_BLOCK);
        let mut blocks = vec![[0u8; SHA1_BLOCK]; count];
        let mut put = |at: usize, byte: u8| blocks[at / SHA1_BLOCK][at % SHA1_BLOCK] = byte;
        for (i, &b) in name.iter().enumerate() {
            put(i, b);
        }
        put(name.len(), 0x80);
        let bits = ((SHA1_BLOCK + name.len()) as u64).wrapping_mul(8);
        for (i, b) in bits.to_be_bytes().into_iter().enumerate() {
            put(count * SHA1_BLOCK - 8 + i, b);
        }
        PaddedName { blocks }
    }

    /// The 80-word message schedule of each block.
    fn schedules(&self) -> Vec<[u32; 80]> {
        self.blocks
            .iter()
            .map(|block| {
                let mut w = [0u32; 80];
                for (word, bytes) in w.iter_mut().zip(block.chunks_exact(4)) {
                    *word = u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
                }
                for t in 16..80 {
                    w[t] = (w[t - 3] ^ w[t - 8] ^ w[t - 14] ^ w[t - 16]).rotate_left(1);
                }
                w
            })
            .collect()
    }
}

/// Hashed lines per block: one per 32-bit lane of a 512-bit vector.
const LANES: usize = 16;

/// One 32-bit word for each line of a block, as stored.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(C, align(64))]
struct Lanes([u32; LANES]);

/// A vector of [`LANES`] 32-bit words and the operations SHA-1 needs.
///
/// Implementations wrap CPU intrinsics and are only ever constructed inside
/// a function compiled for (and called only on) a CPU with those features;
/// all methods are `#[inline(always)]` so that they are compiled as part of
/// that function.
trait Vector: Copy {
    fn load(lanes: &Lanes) -> Self;
    fn splat(v: u32) -> Self;
    fn add(self, other: Self) -> Self;
    fn xor(self, other: Self) -> Self;
    fn rotl1(self) -> Self;
    fn rotl5(self) -> Self;
    fn rotl30(self) -> Self;
    /// SHA-1's Ch: `(b & c) | (!b & d)`.
    fn choose(b: Self, c: Self, d: Self) -> Self;
    /// SHA-1's Parity: `b ^ c ^ d`.
    fn parity(b: Self, c: Self, d: Self) -> Self;
    /// SHA-1's Maj: `(b & c) | (b & d) | (c & d)`.
    fn majority(b: Self, c: Self, d: Self) -> Self;
    /// Bit `i` set when lane `i` of `self` equals lane `i` of `other`.
    fn eq_mask(self, other: Self) -> u32;
}

/// One SHA-1 round in every lane: `v` is `[a, b, c, d, e]`, `f` the round's
/// logical function of `b`, `c`, `d` and `kw` its constant plus message word.
#[inline(always)]
fn step<V: Vector>(v: &mut [V; 5], f: V, kw: V) {
    let [a, b, c, d, e] = *v;
    let next = a.rotl5().add(f).add(e).add(kw);
    *v = [next, a, b.rotl30(), c, d];
}

/// One SHA-1 compression in every lane; `kw(t)` gives round `t`'s constant
/// plus message word, for each lane.
#[inline(always)]
fn compress_lanes<V: Vector>(state: &mut [V; 5], kw: impl Fn(usize) -> V) {
    let mut v = *state;
    for t in 0..20 {
        let [_, b, c, d, _] = v;
        step(&mut v, V::choose(b, c, d), kw(t));
    }
    for t in 20..40 {
        let [_, b, c, d, _] = v;
        step(&mut v, V::parity(b, c, d), kw(t));
    }
    for t in 40..60 {
        let [_, b, c, d, _] = v;
        step(&mut v, V::majority(b, c, d), kw(t));
    }
    for t in 60..80 {
        let [_, b, c, d, _] = v;
        step(&mut v, V::parity(b, c, d), kw(t));
    }
    for (s, x) in state.iter_mut().zip(v) {
        *s = s.add(x);
    }
}

/// SHA-1's constant for round `t`.
fn round_constant(t: usize) -> u32 {
    ROUND_CONSTANTS[t / 20]
}

/// HMAC-SHA1 of the name (given as its blocks' schedules) under the lines
/// of `blocks`, [`LANES`] lines at a time; pushes the entries whose hash
/// matches and stops as `stop` says (see [`HashedLines::scan`]).
#[inline(always)]
fn scan_vectors<V: Vector>(
    blocks: &[Block],
    name: &[[u32; 80]],
    hits: &mut Vec<usize>,
    stop: Stop<'_>,
) -> usize {
    // The name's words plus round constants are the same in every lane.
    let name_kw: Vec<[u32; 80]> = name
        .iter()
        .map(|w| std::array::from_fn(|t| w[t].wrapping_add(round_constant(t))))
        .collect();
    let outer_padding = outer_message([0; 5]).map(V::splat);
    let k: [V; 80] = std::array::from_fn(|t| V::splat(round_constant(t)));
    for (at, block) in blocks.iter().enumerate() {
        let mut inner = block.inner.each_ref().map(V::load);
        for kw in &name_kw {
            compress_lanes(&mut inner, |t| V::splat(kw[t]));
        }
        let mut w = [outer_padding[0]; 80];
        w[..16].copy_from_slice(&outer_padding);
        w[..5].copy_from_slice(&inner);
        for t in 16..80 {
            w[t] = V::parity(w[t - 3], w[t - 8], w[t - 14])
                .xor(w[t - 16])
                .rotl1();
        }
        let mut outer = block.outer.each_ref().map(V::load);
        compress_lanes(&mut outer, |t| w[t].add(k[t]));
        let mut equal = u32::MAX;
        for (got, want) in outer.into_iter().zip(&block.expected) {
            equal &= got.eq_mask(V::load(want));
        }
        if push_lanes(block, equal, hits) && stop(hits) {
            return at + 1;
        }
    }
    blocks.len()
}

/// Decides, after a block added hits, whether the hits so far are enough.
type Stop<'a> = &'a mut dyn FnMut(&[usize]) -> bool;

/// Pushes the entries of `block`'s used lanes whose bit is set in `mask`;
/// true if there were any.
fn push_lanes(block: &Block, mut mask: u32, hits: &mut Vec<usize>) -> bool {
    mask &= (1u32 << block.used) - 1;
    let any = mask != 0;
    while mask != 0 {
        let lane = mask.trailing_zeros() as usize;
        hits.push(block.entries[lane]);
        mask &= mask - 1;
    }
    any
}

/// The same scan one line at a time, with the `sha1` crate's compression
/// (which uses the CPU's SHA instructions where it has them).
fn scan_portable(
    blocks: &[Block],
    name: &PaddedName,
    hits: &mut Vec<usize>,
    stop: Stop<'_>,
) -> usize {
    for (at, block) in blocks.iter().enumerate() {
        let mut mask = 0u32;
        for lane in 0..block.used {
            let key = KeyedSha1 {
                inner: block.inner.map(|w| w.0[lane]),
                outer: block.outer.map(|w| w.0[lane]),
            };
            if key.mac(name) == block.expected.map(|w| w.0[lane]) {
                mask |= 1 << lane;
            }
        }
        if push_lanes(block, mask, hits) && stop(hits) {
            return at + 1;
        }
    }
    blocks.len()
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! [`Vector`] on AVX-512F (one 512-bit register) and on AVX2 (two
    //! 256-bit registers).

    use std::arch::x86_64::*;

    use super::{Lanes, Vector};

    #[derive(Clone, Copy)]
    pub(super) struct Avx512(__m512i);

    // SAFETY (every `unsafe` block in this impl): an `Avx512` only exists
    // inside `scan_avx512`, which runs only after AVX-512F was detected, and
    // `Lanes` is 64 bytes aligned to 64.
    impl Vector for Avx512 {
        #[inline(always)]
        fn load(lanes: &Lanes) -> Self {
            Avx512(unsafe { _mm512_load_si512(lanes.0.as_ptr().cast()) })
        }
        #[inline(always)]
        fn splat(v: u32) -> Self {
            Avx512(unsafe { _mm512_set1_epi32(v as i32) })
        }
        #[inline(always)]
        fn add(self, other: Self) -> Self {
            Avx512(unsafe { _mm512_add_epi32(self.0, other.0) })
        }
        #[inline(always)]
        fn xor(self, other: Self) -> Self {
            Avx512(unsafe { _mm512_xor_si512(self.0, other.0) })
        }
        #[inline(always)]
        fn rotl1(self) -> Self {
            Avx512(unsafe { _mm512_rol_epi32::<1>(self.0) })
        }
        #[inline(always)]
        fn rotl5(self) -> Self {
            Avx512(unsafe { _mm512_rol_epi32::<5>(self.0) })
        }
        #[inline(always)]
        fn rotl30(self) -> Self {
            Avx512(unsafe { _mm512_rol_epi32::<30>(self.0) })
        }
        // Ternary-logic immediates are the truth tables of the functions
        // with b, c, d as the bits 0xf0, 0xcc, 0xaa.
        #[inline(always)]
        fn choose(b: Self, c: Self, d: Self) -> Self {
            Avx512(unsafe { _mm512_ternarylogic_epi32::<0xca>(b.0, c.0, d.0) })
        }
        #[inline(always)]
        fn parity(b: Self, c: Self, d: Self) -> Self {
            Avx512(unsafe { _mm512_ternarylogic_epi32::<0x96>(b.0, c.0, d.0) })
        }
        #[inline(always)]
        fn majority(b: Self, c: Self, d: Self) -> Self {
            Avx512(unsafe { _mm512_ternarylogic_epi32::<0xe8>(b.0, c.0, d.0) })
        }
        #[inline(always)]
        fn eq_mask(self, other: Self) -> u32 {
            u32::from(unsafe { _mm512_cmpeq_epi32_mask(self.0, other.0) })
        }
    }

    #[derive(Clone, Copy)]
    pub(super) struct Avx2([__m256i; 2]);

    impl Avx2 {
        #[inline(always)]
        fn each(self, other: Self, f: impl Fn(__m256i, __m256i) -> __m256i) -> Self {
            Avx2([f(self.0[0], other.0[0]), f(self.0[1], other.0[1])])
        }
        #[inline(always)]
        fn map(self, f: impl Fn(__m256i) -> __m256i) -> Self {
            Avx2([f(self.0[0]), f(self.0[1])])
        }
    }

    // SAFETY (every `unsafe` block in this impl): an `Avx2` only exists
    // inside `scan_avx2`, which runs only after AVX2 was detected, and
    // `Lanes` is 64 bytes aligned to 64.
    impl Vector for Avx2 {
        #[inline(always)]
        fn load(lanes: &Lanes) -> Self {
            let p = lanes.0.as_ptr();
            unsafe {
                Avx2([
                    _mm256_load_si256(p.cast()),
                    _mm256_load_si256(p.add(8).cast()),
                ])
            }
        }
        #[inline(always)]
        fn splat(v: u32) -> Self {
            let x = unsafe { _mm256_set1_epi32(v as i32) };
            Avx2([x, x])
        }
        #[inline(always)]
        fn add(self, other: Self) -> Self {
            self.each(other, |a, b| unsafe { _mm256_add_epi32(a, b) })
        }
        #[inline(always)]
        fn xor(self, other: Self) -> Self {
            self.each(other, |a, b| unsafe { _mm256_xor_si256(a, b) })
        }
        #[inline(always)]
        fn rotl1(self) -> Self {
            self.map(|a| unsafe {
                _mm256_or_si256(_mm256_slli_epi32::<1>(a), _mm256_srli_epi32::<31>(a))
            })
        }
        #[inline(always)]
        fn rotl5(self) -> Self {
            self.map(|a| unsafe {
                _mm256_or_si256(_mm256_slli_epi32::<5>(a), _mm256_srli_epi32::<27>(a))
            })
        }
        #[inline(always)]
        fn rotl30(self) -> Self {
            self.map(|a| unsafe {
                _mm256_or_si256(_mm256_slli_epi32::<30>(a), _mm256_srli_epi32::<2>(a))
            })
        }
        #[inline(always)]
        fn choose(b: Self, c: Self, d: Self) -> Self {
            // d ^ (b & (c ^ d))
            let cd = c.xor(d);
            d.xor(b.each(cd, |x, y| unsafe { _mm256_and_si256(x, y) }))
        }
        #[inline(always)]
        fn parity(b: Self, c: Self, d: Self) -> Self {
            b.xor(c).xor(d)
        }
        #[inline(always)]
        fn majority(b: Self, c: Self, d: Self) -> Self {
            // (b & c) | (d & (b | c))
            let and = |x: Self, y: Self| x.each(y, |p, q| unsafe { _mm256_and_si256(p, q) });
            let or = |x: Self, y: Self| x.each(y, |p, q| unsafe { _mm256_or_si256(p, q) });
            or(and(b, c), and(d, or(b, c)))
        }
        #[inline(always)]
        fn eq_mask(self, other: Self) -> u32 {
            let half = |a: __m256i, b: __m256i| unsafe {
                _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(a, b))) as u32 & 0xff
            };
            half(self.0[0], other.0[0]) | half(self.0[1], other.0[1]) << 8
        }
    }
}

/// Up to [`LANES`] hashed lines: their keyed HMAC states and expected
/// hashes, lane by lane.
#[derive(Clone)]
struct Block {
    inner: [Lanes; 5],
    outer: [Lanes; 5],
    expected: [Lanes; 5],
    /// Entry index of each used lane.
    entries: [usize; LANES],
    /// Lanes in use, from the first.
    used: usize,
}

impl Block {
    fn empty() -> Self {
        let zero = [Lanes([0; LANES]); 5];
        Block {
            inner: zero,
            outer: zero,
            expected: zero,
            entries: [0; LANES],
            used: 0,
        }
    }

    fn set(&mut self, lane: usize, entry: usize, key: &KeyedSha1, expected: Sha1State) {
        let words = [
            (&mut self.inner, key.inner),
            (&mut self.outer, key.outer),
            (&mut self.expected, expected),
        ];
        for (lanes, state) in words {
            for (word, value) in lanes.iter_mut().zip(state) {
                word.0[lane] = value;
            }
        }
        self.entries[lane] = entry;
    }
}

/// The hashed lines of one file, in the order they were added.
#[derive(Clone, Default)]
pub(super) struct HashedLines {
    blocks: Vec<Block>,
    len: usize,
}

impl fmt::Debug for HashedLines {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HashedLines({} lines)", self.len)
    }
}

impl HashedLines {
    /// Adds the line `entry` (an index into the file's entries; callers add
    /// them in ascending order) with its salt and hash.
    pub(super) fn push(&mut self, entry: usize, salt: &[u8; SHA1_LEN], hash: &[u8; SHA1_LEN]) {
        if self.blocks.last().is_none_or(|b| b.used == LANES) {
            self.blocks.push(Block::empty());
        }
        let Some(block) = self.blocks.last_mut() else {
            return;
        };
        block.set(block.used, entry, &KeyedSha1::new(salt), sha1_words(hash));
        block.used += 1;
        self.len += 1;
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// How far a scan has to go to have looked at every line: lines are
    /// hashed in blocks, and a scan position counts blocks.
    pub(super) fn end(&self) -> usize {
        self.blocks.len()
    }

    /// The entries whose hash is HMAC-SHA1(salt, `name`), in the order they
    /// were added.
    #[cfg(test)]
    pub(super) fn matching(&self, name: &str) -> Vec<usize> {
        let mut hits = Vec::new();
        self.scan(name, 0, &mut hits, &mut |_| false);
        hits
    }

    /// Looks for `name` in the lines from scan position `from` on, appending
    /// the matching entries to `hits` in the order they were added. After
    /// each block that matched, `stop` is asked whether `hits` are enough;
    /// if so the scan ends there. Returns where it ended: [`HashedLines::end`]
    /// once every line from `from` on was looked at, else where to go on.
    pub(super) fn scan(
        &self,
        name: &str,
        from: usize,
        hits: &mut Vec<usize>,
        stop: Stop<'_>,
    ) -> usize {
        from + self.scan_at(Level::best(), name, from, hits, stop)
    }

    /// [`HashedLines::scan`] at a given level; returns the blocks looked at.
    fn scan_at(
        &self,
        level: Level,
        name: &str,
        from: usize,
        hits: &mut Vec<usize>,
        stop: Stop<'_>,
    ) -> usize {
        let blocks = self.blocks.get(from..).unwrap_or_default();
        if blocks.is_empty() {
            return 0;
        }
        let name = PaddedName::new(name);
        match level {
            Level::Portable => scan_portable(blocks, &name, hits, stop),
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Level::Avx2` is only chosen when the CPU has AVX2.
            Level::Avx2 => unsafe { scan_avx2(blocks, &name.schedules(), hits, stop) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Level::Avx512` is only chosen when the CPU has AVX-512F.
            Level::Avx512 => unsafe { scan_avx512(blocks, &name.schedules(), hits, stop) },
        }
    }

    #[cfg(test)]
    fn matching_at(&self, level: Level, name: &str) -> Vec<usize> {
        let mut hits = Vec::new();
        self.scan_at(level, name, 0, &mut hits, &mut |_| false);
        hits
    }
}

/// Which implementation of the scan to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Level {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl Level {
    /// Every level this CPU can run, best last.
    fn available() -> Vec<Level> {
        let mut levels = vec![Level::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2") {
                levels.push(Level::Avx2);
            }
            if std::arch::is_x86_feature_detected!("avx512f") {
                levels.push(Level::Avx512);
            }
        }
        levels
    }

    fn best() -> Level {
        static BEST: std::sync::OnceLock<Level> = std::sync::OnceLock::new();
        *BEST.get_or_init(|| Level::available().pop().unwrap_or(Level::Portable))
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn scan_avx2(blocks: &[Block], name: &[[u32; 80]], hits: &mut Vec<usize>, stop: Stop<'_>) -> usize {
    scan_vectors::<x86::Avx2>(blocks, name, hits, stop)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn scan_avx512(
    blocks: &[Block],
    name: &[[u32; 80]],
    hits: &mut Vec<usize>,
    stop: Stop<'_>,
) -> usize {
    scan_vectors::<x86::Avx512>(blocks, name, hits, stop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::known_hosts::hmac_sha1;
    use crate::known_hosts::tests::TestRng as Rng;

    /// A pseudo-random lookup name of `len` bytes.
    fn random_name(rng: &mut Rng, len: usize) -> String {
        const CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789.-[]:";
        (0..len)
            .map(|_| char::from(CHARS[rng.next() as usize % CHARS.len()]))
            .collect()
    }

    #[test]
    fn keyed_sha1_is_hmac_sha1() {
        let mut rng = Rng(7);
        for len in (0..=140).chain([200, 1000]) {
            let name = random_name(&mut rng, len);
            let salt = rng.salt();
            let expected = hmac_sha1(&salt, name.as_bytes());
            let got = KeyedSha1::new(&salt).mac(&PaddedName::new(&name));
            assert_eq!(got, sha1_words(&expected), "length {len}");
        }
    }

    /// Every level this CPU has finds exactly the lines that hash the name,
    /// in full blocks and in a partly used last block, for names of one, two
    /// and three SHA-1 blocks.
    #[test]
    fn every_level_finds_exactly_the_matching_lines() {
        let levels = Level::available();
        assert!(levels.contains(&Level::Portable));
        let mut rng = Rng(0x5eed);
        for len in [0, 1, 9, 23, 55, 56, 63, 64, 119, 120, 130] {
            let wanted = random_name(&mut rng, len);
            let other = random_name(&mut rng, len + 1);
            for lines in [1, 15, 16, 17, 40] {
                let mut hashed = HashedLines::default();
                let mut expected = Vec::new();
                for i in 0..lines {
                    let salt = rng.salt();
                    let name = if i % 3 == 1 { &wanted } else { &other };
                    let hash = hmac_sha1(&salt, name.as_bytes());
                    // Entry numbers need not be contiguous.
                    let entry = 2 * i + 5;
                    hashed.push(entry, &salt, &hash);
                    if i % 3 == 1 {
                        expected.push(entry);
                    }
                }
                assert_eq!(hashed.len(), lines);
                for &level in &levels {
                    assert_eq!(
                        hashed.matching_at(level, &wanted),
                        expected,
                        "{level:?}, name of {len} bytes, {lines} lines"
                    );
                    assert!(hashed
                        .matching_at(level, &random_name(&mut rng, len + 2))
                        .is_empty());
                }
            }
        }
    }

    /// A scan that stops after the first block with a hit and is then
    /// resumed, at every level, finds the same lines as one full scan.
    #[test]
    fn a_stopped_scan_resumes_where_it_stopped() {
        let mut rng = Rng(0xabc);
        let wanted = random_name(&mut rng, 20);
        let other = random_name(&mut rng, 20);
        let mut hashed = HashedLines::default();
        let mut expected = Vec::new();
        for i in 0..100 {
            let salt = rng.salt();
            let hit = [3, 4, 40, 99].contains(&i);
            let hash = hmac_sha1(&salt, if hit { &wanted } else { &other }.as_bytes());
            hashed.push(i, &salt, &hash);
            if hit {
                expected.push(i);
            }
        }
        assert_eq!(hashed.end(), 7);
        for level in Level::available() {
            let mut hits = Vec::new();
            let mut stops = Vec::new();
            let mut at = 0;
            while at < hashed.end() {
                at += hashed.scan_at(level, &wanted, at, &mut hits, &mut |_| true);
                stops.push(at);
            }
            assert_eq!(hits, expected, "{level:?}");
            // Blocks 0, 2 and 6 hold the hits; the last scan ends at the end.
            assert_eq!(stops, vec![1, 3, 7], "{level:?}");
            assert_eq!(
                hashed.scan_at(level, &wanted, 7, &mut hits, &mut |_| true),
                0
            );
        }
    }

    /// A line whose hash is off by one bit in any word matches nothing.
    #[test]
    fn one_flipped_bit_never_matches() {
        let salt = [9u8; SHA1_LEN];
        for byte in [0, 4, 8, 12, 16, 19] {
            let mut hash = hmac_sha1(&salt, b"host.example");
            hash[byte] ^= 0x10;
            let mut hashed = HashedLines::default();
            hashed.push(0, &salt, &hash);
            for level in Level::available() {
                assert!(hashed.matching_at(level, "host.example").is_empty());
            }
        }
    }
}
