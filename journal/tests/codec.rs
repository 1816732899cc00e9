//! Property tests of the record codec: round trips, and random or damaged bytes never panic.
#![allow(clippy::unwrap_used)]

mod strategies;

use dtask_journal::record::{self, Digest};
use dtask_journal::{CorruptionKind, Event, Timestamp};
use proptest::prelude::*;
use strategies::event;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn record_round_trips(event in event(), task in "[a-z]{1,8}", position in 0..=dtask_journal::keys::MAX_POSITION, seq in 1..=dtask_journal::keys::MAX_SEQUENCE, prev in any::<[u8; 32]>()) {
        let prev = Digest(prev);
        let payload = record::encode_payload(&event).unwrap();
        let (bytes, digest) = record::frame(&task, position, seq, &payload, &prev).unwrap();
        let decoded = record::decode(&task, position, &prev, &bytes).unwrap();
        prop_assert_eq!(decoded.event, event);
        prop_assert_eq!(decoded.seq, seq);
        prop_assert_eq!(decoded.digest, digest);
        prop_assert_eq!(decoded.size, bytes.len());
    }

    /// The writer's in-place framing makes the same bytes as framing a payload encoded on its
    /// own, and the payload is bincode's encoding of the event (formats unchanged).
    #[test]
    fn framing_in_place_makes_the_same_record(event in event(), task in "[a-z]{1,8}", position in 0..=dtask_journal::keys::MAX_POSITION, seq in 1..=dtask_journal::keys::MAX_SEQUENCE, prev in any::<[u8; 32]>()) {
        let prev = Digest(prev);
        let payload = record::encode_payload(&event).unwrap();
        prop_assert_eq!(&payload, &bincode::serde::encode_to_vec(&event, bincode::config::standard()).unwrap());
        let unframed = record::Unframed::encode(&event).unwrap();
        prop_assert_eq!(unframed.payload(), &payload[..]);
        let in_place = unframed.frame(&task, position, seq, &prev).unwrap();
        prop_assert_eq!(in_place, record::frame(&task, position, seq, &payload, &prev).unwrap());
    }

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = record::decode("t", 0, &Digest::GENESIS, &bytes);
        let _ = record::decode_payload(&bytes);
    }

    /// The fold's lean decode gives the full event, minus an update's kind, data and
    /// metadata, and refuses exactly the payloads the full decode refuses.
    #[test]
    fn lean_decode_agrees_with_the_full_decode(event in event(), cut in any::<prop::sample::Index>(), index in any::<prop::sample::Index>(), byte in any::<u8>()) {
        let payload = record::encode_payload(&event).unwrap();
        prop_assert_eq!(record::decode_payload_lean(&payload).unwrap(), lean(event));
        let mut damaged = payload.clone();
        let at = index.index(damaged.len());
        damaged[at] = byte;
        damaged.truncate(cut.index(damaged.len() + 1).max(at));
        damaged.push(0);
        let full = record::decode_payload(&damaged);
        let lean_decoded = record::decode_payload_lean(&damaged);
        prop_assert_eq!(full.is_ok(), lean_decoded.is_ok(), "{:?} / {:?}", full, lean_decoded);
        if let (Ok(full), Ok(lean_decoded)) = (full, lean_decoded) {
            prop_assert_eq!(lean(full), lean_decoded);
        }
    }

    #[test]
    fn random_payloads_decode_lean_as_they_decode_in_full(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let full = record::decode_payload(&bytes).map(lean);
        let lean_decoded = record::decode_payload_lean(&bytes);
        prop_assert_eq!(full.is_ok(), lean_decoded.is_ok());
        if let (Ok(full), Ok(lean_decoded)) = (full, lean_decoded) {
            prop_assert_eq!(full, lean_decoded);
        }
    }

    #[test]
    fn any_single_byte_flip_is_detected(event in event(), index in any::<prop::sample::Index>(), bit in 0u8..8) {
        let payload = record::encode_payload(&event).unwrap();
        let (mut bytes, _) = record::frame("t", 5, 7, &payload, &Digest::GENESIS).unwrap();
        let at = index.index(bytes.len());
        bytes[at] ^= 1 << bit;
        prop_assert!(record::decode("t", 5, &Digest::GENESIS, &bytes).is_err());
    }

    #[test]
    fn truncation_is_detected(event in event(), cut in any::<prop::sample::Index>()) {
        let payload = record::encode_payload(&event).unwrap();
        let (bytes, _) = record::frame("t", 0, 1, &payload, &Digest::GENESIS).unwrap();
        let keep = cut.index(bytes.len());
        let err = record::decode("t", 0, &Digest::GENESIS, &bytes[..keep]).unwrap_err();
        prop_assert!(matches!(err, CorruptionKind::Truncated { .. } | CorruptionKind::Checksum { .. }), "{err:?}");
    }
}

/// What the lean decode keeps of `event`.
fn lean(event: Event) -> Event {
    match event {
        Event::UpdateAppended {
            attempt,
            event_id,
            at,
            ..
        } => Event::UpdateAppended {
            attempt,
            event_id,
            kind: String::new(),
            data: Vec::new(),
            metadata: Vec::new(),
            at,
        },
        other => other,
    }
}

#[test]
fn lean_decode_of_an_update_drops_its_payload_only() {
    let update = Event::UpdateAppended {
        attempt: 3,
        event_id: "e-1".into(),
        kind: "progress".into(),
        data: b"half way".to_vec(),
        metadata: vec![("k".into(), "v".into())],
        at: Timestamp(9),
    };
    let payload = record::encode_payload(&update).unwrap();
    assert_eq!(
        record::decode_payload_lean(&payload).unwrap(),
        Event::UpdateAppended {
            attempt: 3,
            event_id: "e-1".into(),
            kind: String::new(),
            data: Vec::new(),
            metadata: Vec::new(),
            at: Timestamp(9),
        }
    );
    // Invalid UTF-8 in the kind, which the lean decode does not keep, is still refused.
    let mut bad = payload.clone();
    let at = bad.windows(8).position(|w| w == b"progress").unwrap();
    bad[at] = 0xff;
    assert!(record::decode_payload(&bad).is_err());
    assert!(record::decode_payload_lean(&bad).is_err());
}
