//! The answer frame of both chunk transports, defined once: [`crate::socket`] (a node's on-demand
//! server to the node's `sw-pool-serve`, over a Unix stream) and the exchange between the nodes'
//! on-demand servers (MPI messages, `swpool_core::ondemand::exchange`). An answer is its head —
//! `status: u8` (0: the chunk follows; anything else: a message, UTF-8, saying why not), `len: u32`
//! little endian — then `len` bytes. Each transport bounds what it accepts by what it asked for.

/// Bytes of an answer's head.
pub const HEAD: usize = 5;

/// What an answer's head announces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// The chunk, this many bytes.
    Chunk(u32),
    /// Why not, in this many bytes of text.
    Message(u32),
}

impl Answer {
    /// The head that announces this answer.
    pub fn head(self) -> [u8; HEAD] {
        let (status, len) = match self {
            Answer::Chunk(n) => (0u8, n),
            Answer::Message(n) => (1u8, n),
        };
        let mut h = [status, 0, 0, 0, 0];
        h[1..].copy_from_slice(&len.to_le_bytes());
        h
    }

    /// What a received head announces (any nonzero status is a message).
    pub fn parse(head: &[u8; HEAD]) -> Answer {
        let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]);
        match head[0] {
            0 => Answer::Chunk(len),
            _ => Answer::Message(len),
        }
    }

    /// The number of bytes after the head.
    pub fn body_len(self) -> u32 {
        match self {
            Answer::Chunk(n) | Answer::Message(n) => n,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_round_trip_and_any_nonzero_status_is_a_message() {
        for a in [
            Answer::Chunk(0),
            Answer::Chunk(1 << 20),
            Answer::Message(4096),
            Answer::Chunk(u32::MAX),
        ] {
            assert_eq!(Answer::parse(&a.head()), a);
        }
        assert_eq!(Answer::Chunk(0x0102_0304).head(), [0, 4, 3, 2, 1]);
        assert_eq!(Answer::parse(&[7, 5, 0, 0, 0]), Answer::Message(5));
        assert_eq!(Answer::Message(9).body_len(), 9);
    }
}
