//! The events' byte fields are serialized with `serde_bytes` (`#[serde(with = "serde_bytes")]`):
//! as serde *bytes* rather than sequences of `u8`. The encoding is the same in bincode (a
//! length, then the raw bytes: format v1 is unchanged, as this test and the golden fixture
//! hold) and in JSON (an array of numbers), but the decoder copies the bytes in one go
//! instead of visiting them one by one.
#![allow(clippy::unwrap_used)]

mod tests {
    use proptest::prelude::*;
    use serde::{Deserialize, Serialize};

    /// Byte fields through the helpers.
    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct AsBytes {
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
        #[serde(with = "serde_bytes")]
        snapshot: Option<Vec<u8>>,
    }

    /// The same fields as plain sequences of `u8`: how format v1 was first written.
    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct AsSeq {
        data: Vec<u8>,
        snapshot: Option<Vec<u8>>,
    }

    proptest! {
        #[test]
        fn bytes_and_sequences_encode_alike(data in proptest::collection::vec(any::<u8>(), 0..300), snapshot in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..300))) {
            let config = bincode::config::standard();
            let bytes = AsBytes { data: data.clone(), snapshot: snapshot.clone() };
            let seq = AsSeq { data, snapshot };
            let encoded = bincode::serde::encode_to_vec(&bytes, config).unwrap();
            prop_assert_eq!(&encoded, &bincode::serde::encode_to_vec(&seq, config).unwrap());
            let (decoded, _): (AsBytes, usize) = bincode::serde::decode_from_slice(&encoded, config).unwrap();
            prop_assert_eq!(&decoded, &bytes);
            // JSON: the same arrays of numbers, read back either way.
            let json = serde_json::to_string(&bytes).unwrap();
            prop_assert_eq!(&json, &serde_json::to_string(&seq).unwrap());
            prop_assert_eq!(serde_json::from_str::<AsBytes>(&json).unwrap(), bytes);
        }
    }
}
