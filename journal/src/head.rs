//! The task head: where a task's stream ends.
//!
//! # Byte layout (version 1)
//!
//! ```text
//! offset  size  field
//! 0       1     head version (= 1)
//! 1       8     next position = number of records in the stream (u64 BE)
//! 9       8     global sequence of the last record (u64 BE)
//! 17      32    chain digest of the last record (GENESIS when empty)
//! 49      1     terminal flag (1 once a terminal event was appended)
//! 50      4     CRC-32 of bytes [0 .. 50], little-endian
//! ```
//!
//! The head is rewritten in the same batch as every append to the task. Comparing it with the
//! stream detects a deleted or replaced last record.

use crate::error::CorruptionKind;
use crate::record::Digest;

const HEAD_VERSION: u8 = 1;
const HEAD_LEN: usize = 54;

/// Where a task's stream ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Head {
    /// The number of records in the stream (the next append's position).
    pub next_position: u64,
    /// The global sequence of the last record (0 for an empty stream).
    pub last_seq: u64,
    /// The chain digest of the last record.
    pub last_digest: Digest,
    /// Whether a terminal event has been appended.
    pub terminal: bool,
}

impl Head {
    /// Encodes the head.
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEAD_LEN);
        out.push(HEAD_VERSION);
        out.extend_from_slice(&self.next_position.to_be_bytes());
        out.extend_from_slice(&self.last_seq.to_be_bytes());
        out.extend_from_slice(&self.last_digest.0);
        out.push(u8::from(self.terminal));
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// Decodes a head, verifying its length, version and CRC.
    ///
    /// # Errors
    /// The [`CorruptionKind`] describing the damage.
    pub fn decode(bytes: &[u8]) -> Result<Self, CorruptionKind> {
        if bytes.len() != HEAD_LEN {
            return Err(CorruptionKind::Truncated { len: bytes.len() });
        }
        let (body, crc) = bytes.split_at(HEAD_LEN - 4);
        let stored = u32::from_le_bytes(
            crc.try_into()
                .map_err(|_| CorruptionKind::Truncated { len: bytes.len() })?,
        );
        let computed = crc32fast::hash(body);
        if stored != computed {
            return Err(CorruptionKind::Checksum { stored, computed });
        }
        let field = |at: usize| -> Result<[u8; 8], CorruptionKind> {
            body.get(at..at + 8)
                .and_then(|s| s.try_into().ok())
                .ok_or(CorruptionKind::Truncated { len: bytes.len() })
        };
        match body.first() {
            Some(&HEAD_VERSION) => {}
            Some(&v) => return Err(CorruptionKind::UnknownVersion(v)),
            None => return Err(CorruptionKind::Truncated { len: 0 }),
        }
        let digest: [u8; 32] = body
            .get(17..49)
            .and_then(|s| s.try_into().ok())
            .ok_or(CorruptionKind::Truncated { len: bytes.len() })?;
        Ok(Self {
            next_position: u64::from_be_bytes(field(1)?),
            last_seq: u64::from_be_bytes(field(9)?),
            last_digest: Digest(digest),
            terminal: body.get(49) == Some(&1),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_damage() {
        let head = Head {
            next_position: 7,
            last_seq: 99,
            last_digest: Digest([3; 32]),
            terminal: true,
        };
        let mut bytes = head.encode();
        assert_eq!(Head::decode(&bytes), Ok(head));
        bytes[3] ^= 1;
        assert!(matches!(
            Head::decode(&bytes),
            Err(CorruptionKind::Checksum { .. })
        ));
        assert!(matches!(
            Head::decode(&bytes[..10]),
            Err(CorruptionKind::Truncated { len: 10 })
        ));
    }
}
