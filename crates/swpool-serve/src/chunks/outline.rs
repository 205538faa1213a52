//! A chunk's outline: the BLAKE3 chaining values of its pieces ([`PIECE`] bytes each, the last one
//! shorter), from which its hash — the BLAKE3 hash the manifest records for it — is computed, as
//! BLAKE3 hashes any input: a binary tree over 1 KiB leaves, its subtrees aligned to powers of two
//! (section 2.1 of the BLAKE3 paper; the same property Bao's verified streaming uses).
//!
//! The engine computes the outline while it verifies a whole chunk ([`Outline::verify`]: the
//! pieces' values merged up to the root must give the manifest's hash, else nothing is kept) and
//! keeps it, 1 KiB for a 1 MiB chunk, after the chunk's bytes have left its memory. A later read
//! of that chunk then fetches only the pieces it needs and checks each against its value
//! ([`Outline::check`]): a piece whose bytes differ from those that were verified does not match,
//! so no unverified byte is served, and a random 4 KiB read moves and hashes a piece or two
//! instead of the whole chunk again.

use blake3::hazmat::{
    left_subtree_len, merge_subtrees_non_root, merge_subtrees_root, ChainingValue, HasherExt, Mode,
};

/// Bytes of a piece: a power of two of at least BLAKE3's 1 KiB leaf, so that every piece is a
/// subtree of the chunk's tree. 32 KiB: a squashfs block (128 KiB by default) spans four or five.
pub const PIECE: u64 = 32 << 10;

/// A chunk's bytes do not give its hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mismatch;

/// See the module's documentation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outline {
    /// The chaining value of each piece of the chunk, in order.
    cvs: Vec<ChainingValue>,
    /// The chunk's length.
    len: u64,
}

/// The chaining value of the piece at `offset` of its chunk (a subtree, never the root).
fn piece_cv(offset: u64, bytes: &[u8]) -> ChainingValue {
    blake3::Hasher::new()
        .set_input_offset(offset)
        .update(bytes)
        .finalize_non_root()
}

impl Outline {
    /// The outline of `chunk` if its BLAKE3 hash is `want`; `None` if it is not (the chunk does
    /// not verify), or if it is a single piece (then it is always read whole).
    pub fn verify(chunk: &[u8], want: &[u8; 32]) -> Result<Option<Outline>, Mismatch> {
        let len = chunk.len() as u64;
        if len <= PIECE {
            return match blake3::hash(chunk).as_bytes() == want {
                true => Ok(None),
                false => Err(Mismatch),
            };
        }
        let cvs: Vec<ChainingValue> = chunk
            .chunks(PIECE as usize)
            .enumerate()
            .map(|(k, p)| piece_cv(k as u64 * PIECE, p))
            .collect();
        let o = Outline { cvs, len };
        match &o.root() == want {
            true => Ok(Some(o)),
            false => Err(Mismatch),
        }
    }

    /// The chunk's hash from the pieces' values.
    fn root(&self) -> [u8; 32] {
        // the root's two children; below them, non-root parents
        let split = left_subtree_len(self.len);
        let left = self.subtree(0, split);
        let right = self.subtree(split, self.len - split);
        *merge_subtrees_root(&left, &right, Mode::Hash).as_bytes()
    }

    /// The chaining value of the subtree of `len` bytes at `start` (piece-aligned).
    fn subtree(&self, start: u64, len: u64) -> ChainingValue {
        if len <= PIECE {
            return self.cvs[(start / PIECE) as usize];
        }
        let split = left_subtree_len(len);
        let left = self.subtree(start, split);
        let right = self.subtree(start + split, len - split);
        merge_subtrees_non_root(&left, &right, Mode::Hash)
    }

    /// Bytes it keeps (for the engine's bound).
    pub fn size(&self) -> usize {
        self.cvs.len() * 32
    }

    /// The pieces (by index) that cover `a..b` of the chunk, as a byte range of the chunk.
    pub fn cover(&self, a: u64, b: u64) -> std::ops::Range<u64> {
        let start = a / PIECE * PIECE;
        let end = (b.div_ceil(PIECE) * PIECE).min(self.len);
        start..end
    }

    /// Whether `bytes`, the chunk's bytes at `start` (piece-aligned, whole pieces but for the
    /// chunk's last), are the bytes that were verified.
    pub fn check(&self, start: u64, bytes: &[u8]) -> bool {
        if bytes.is_empty() || start % PIECE != 0 || start + bytes.len() as u64 > self.len {
            return false;
        }
        bytes.chunks(PIECE as usize).enumerate().all(|(k, p)| {
            let at = start + k as u64 * PIECE;
            let whole = p.len() as u64 == PIECE || at + p.len() as u64 == self.len;
            whole && piece_cv(at, p) == self.cvs[(at / PIECE) as usize]
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(n: usize, seed: u8) -> Vec<u8> {
        (0..n)
            .map(|i| (i as u32).wrapping_mul(2654435761).to_le_bytes()[3] ^ seed)
            .collect()
    }

    #[test]
    fn its_root_is_blake3_of_the_chunk_for_every_shape() {
        // whole pieces, a short last piece, a last piece of one byte, powers of two and not
        let p = PIECE as usize;
        for len in [
            1,
            1024,
            p,
            p + 1,
            2 * p,
            2 * p + 7,
            3 * p,
            5 * p - 1,
            (1 << 20) - 1,
            1 << 20,
            (1 << 20) + 1,
            3 << 20,
        ] {
            let c = bytes(len, len as u8);
            let h = *blake3::hash(&c).as_bytes();
            let o = Outline::verify(&c, &h).unwrap_or_else(|_| panic!("{len}: no match"));
            assert_eq!(o.is_some(), len > p, "{len}");
            let mut bad = h;
            bad[0] ^= 1;
            assert!(Outline::verify(&c, &bad).is_err(), "{len}");
        }
    }

    #[test]
    fn a_piece_checks_only_with_the_bytes_that_were_verified() {
        let c = bytes((1 << 20) + 5000, 3);
        let o = Outline::verify(&c, blake3::hash(&c).as_bytes())
            .unwrap()
            .unwrap();
        let p = PIECE as usize;
        // every piece, alone and in runs; the short last one
        assert!(o.check(0, &c[..p]));
        assert!(o.check(PIECE, &c[p..4 * p]));
        assert!(o.check(32 * PIECE, &c[32 * p..]));
        assert!(o.check(0, &c));
        // one bit changed in any piece, a piece at the wrong place, a cut piece, misaligned
        for at in [0, p - 1, 5 * p + 17, c.len() - 1] {
            let mut d = c.clone();
            d[at] ^= 0x10;
            assert!(!o.check(0, &d), "{at}");
        }
        assert!(!o.check(PIECE, &c[..p]));
        assert!(!o.check(0, &c[..p - 1]));
        assert!(!o.check(1, &c[1..p + 1]));
        assert!(!o.check(32 * PIECE, &c[32 * p..c.len() - 1]));
        assert!(!o.check(33 * PIECE, &c[..1]));
        assert_eq!(o.cover(5, 10), 0..PIECE);
        assert_eq!(o.cover(PIECE - 1, PIECE + 1), 0..2 * PIECE);
        assert_eq!(
            o.cover(32 * PIECE + 1, 32 * PIECE + 2),
            32 * PIECE..c.len() as u64
        );
    }
}
