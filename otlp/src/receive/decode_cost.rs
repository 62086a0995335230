//! What decoding an `ExportProfilesServiceRequest` will cost in memory,
//! known from one pass over the wire bytes before anything is allocated.
//!
//! Protobuf decoding amplifies: a two-byte empty `Sample` becomes a struct
//! of over a hundred bytes, so a 16 MiB request can decode to gigabytes.
//! Budgeting by wire size would let that through; this walk counts each
//! message, string and repeated element the decoder will allocate, using
//! the decoder's own struct sizes, and bounds the total from above (every
//! vector as if it had doubled past its length). Malformed input is found
//! here too, before the decoder sees it.

use std::mem::size_of;

use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use opentelemetry_proto::tonic::common::v1::{
    AnyValue, ArrayValue, EntityRef, InstrumentationScope, KeyValue, KeyValueList,
};
use opentelemetry_proto::tonic::profiles::v1development::{
    Function, KeyValueAndUnit, Line, Link, Location, Mapping, Profile, ProfilesDictionary,
    ResourceProfiles, Sample, ScopeProfiles, Stack, ValueType,
};
use opentelemetry_proto::tonic::resource::v1::Resource;

/// Nesting the walk follows; the decoder refuses deeper messages too
/// (prost's recursion limit is 100).
const MAX_DEPTH: u32 = 100;
/// What the allocator adds to each allocation, at most.
const ALLOCATION_OVERHEAD: usize = 16;

/// Why the bytes are not a well-formed message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// A varint runs past the end or over ten bytes.
    #[error("truncated or overlong varint at byte {0}")]
    Varint(usize),
    /// A length-delimited field or fixed-width value runs past its message.
    #[error("field at byte {0} runs past the end of its message")]
    Truncated(usize),
    /// Field number 0, or a wire type protobuf does not define (groups included).
    #[error("invalid tag at byte {0}")]
    Tag(usize),
    /// Messages nested deeper than the decoder accepts.
    #[error("messages nested over {MAX_DEPTH} deep")]
    TooDeep,
}

/// How a field decodes.
#[derive(Clone, Copy)]
enum Kind {
    /// A repeated message: each element a struct in a vector, plus its own heap.
    Messages(&'static Schema),
    /// A singular message: stored inline, only its heap counts.
    Message(&'static Schema),
    /// A singular string or bytes field.
    Bytes,
    /// A repeated string or bytes field.
    RepeatedBytes,
    /// A repeated varint number, packed or not, of this many bytes in memory.
    Numbers(usize),
    /// A repeated fixed-width number, packed or not, of this many bytes on
    /// the wire and in memory.
    Fixed(usize),
}

/// A message type: its size in memory and the fields that allocate.
/// Scalar fields and unknown fields allocate nothing and are only skipped.
struct Schema {
    fields: &'static [(u32, Kind)],
    size: usize,
}

macro_rules! schema {
    ($name:ident, $ty:ty, [$(($n:expr, $k:expr)),* $(,)?]) => {
        static $name: Schema = Schema { fields: &[$(($n, $k)),*], size: size_of::<$ty>() };
    };
}

use Kind::{Bytes, Fixed, Message, Messages, Numbers, RepeatedBytes};

schema!(
    REQUEST,
    ExportProfilesServiceRequest,
    [(1, Messages(&RESOURCE_PROFILES)), (2, Message(&DICTIONARY))]
);
schema!(
    RESOURCE_PROFILES,
    ResourceProfiles,
    [
        (1, Message(&RESOURCE)),
        (2, Messages(&SCOPE_PROFILES)),
        (3, Bytes)
    ]
);
schema!(
    RESOURCE,
    Resource,
    [(1, Messages(&KEY_VALUE)), (3, Messages(&ENTITY_REF))]
);
schema!(
    ENTITY_REF,
    EntityRef,
    [
        (1, Bytes),
        (2, Bytes),
        (3, RepeatedBytes),
        (4, RepeatedBytes)
    ]
);
schema!(KEY_VALUE, KeyValue, [(1, Bytes), (2, Message(&ANY_VALUE))]);
schema!(
    ANY_VALUE,
    AnyValue,
    [
        (1, Bytes),
        (5, Message(&ARRAY_VALUE)),
        (6, Message(&KEY_VALUE_LIST)),
        (7, Bytes)
    ]
);
schema!(ARRAY_VALUE, ArrayValue, [(1, Messages(&ANY_VALUE))]);
schema!(KEY_VALUE_LIST, KeyValueList, [(1, Messages(&KEY_VALUE))]);
schema!(
    SCOPE_PROFILES,
    ScopeProfiles,
    [(1, Message(&SCOPE)), (2, Messages(&PROFILE)), (3, Bytes)]
);
schema!(
    SCOPE,
    InstrumentationScope,
    [(1, Bytes), (2, Bytes), (3, Messages(&KEY_VALUE))]
);
schema!(
    PROFILE,
    Profile,
    [
        (1, Message(&VALUE_TYPE)),
        (2, Messages(&SAMPLE)),
        (5, Message(&VALUE_TYPE)),
        (7, Bytes),
        (9, Bytes),
        (10, Bytes),
        (11, Numbers(size_of::<i32>())),
    ]
);
schema!(VALUE_TYPE, ValueType, []);
schema!(
    SAMPLE,
    Sample,
    [
        (2, Numbers(size_of::<i32>())),
        (4, Numbers(size_of::<i64>())),
        (5, Fixed(size_of::<u64>())),
    ]
);
schema!(
    DICTIONARY,
    ProfilesDictionary,
    [
        (1, Messages(&MAPPING)),
        (2, Messages(&LOCATION)),
        (3, Messages(&FUNCTION)),
        (4, Messages(&LINK)),
        (5, RepeatedBytes),
        (6, Messages(&KEY_VALUE_AND_UNIT)),
        (7, Messages(&STACK)),
    ]
);
schema!(MAPPING, Mapping, [(5, Numbers(size_of::<i32>()))]);
schema!(
    LOCATION,
    Location,
    [(3, Messages(&LINE)), (4, Numbers(size_of::<i32>()))]
);
schema!(LINE, Line, []);
schema!(FUNCTION, Function, []);
schema!(LINK, Link, [(1, Bytes), (2, Bytes)]);
schema!(
    KEY_VALUE_AND_UNIT,
    KeyValueAndUnit,
    [(2, Message(&ANY_VALUE))]
);
schema!(STACK, Stack, [(1, Numbers(size_of::<i32>()))]);

/// Bytes of memory decoding `wire` as an `ExportProfilesServiceRequest`
/// will allocate, at most (the top-level struct included).
pub fn decoded_bytes(wire: &[u8]) -> Result<usize, WireError> {
    let mut walk = Walk { wire, total: 0 };
    walk.message(&REQUEST, 0, wire.len(), 0)?;
    Ok(walk.total.saturating_add(REQUEST.size))
}

struct Walk<'a> {
    wire: &'a [u8],
    total: usize,
}

impl Walk<'_> {
    fn add(&mut self, bytes: usize) {
        self.total = self.total.saturating_add(bytes);
    }

    /// A vector element: room for it twice over (growth by doubling), and
    /// the allocation's overhead, as if each element were the first.
    fn element(&mut self, size: usize) {
        self.add(size.saturating_mul(2).saturating_add(ALLOCATION_OVERHEAD));
    }

    /// A packed vector of `elements` numbers of `size` bytes, doubled.
    fn packed(&mut self, elements: usize, size: usize) {
        self.add(
            elements
                .saturating_mul(size)
                .saturating_mul(2)
                .saturating_add(ALLOCATION_OVERHEAD),
        );
    }

    fn varint(&self, at: &mut usize) -> Result<u64, WireError> {
        let start = *at;
        let mut value = 0u64;
        for shift in 0..10 {
            let byte = *self.wire.get(*at).ok_or(WireError::Varint(start))?;
            *at += 1;
            value |= u64::from(byte & 0x7f) << (7 * shift);
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(WireError::Varint(start))
    }

    /// Walks the message in `wire[start..end]`.
    fn message(
        &mut self,
        schema: &Schema,
        start: usize,
        end: usize,
        depth: u32,
    ) -> Result<(), WireError> {
        if depth > MAX_DEPTH {
            return Err(WireError::TooDeep);
        }
        let mut at = start;
        while at < end {
            let tag_at = at;
            let tag = self.varint(&mut at)?;
            let number = u32::try_from(tag >> 3).map_err(|_| WireError::Tag(tag_at))?;
            if number == 0 {
                return Err(WireError::Tag(tag_at));
            }
            let kind = schema
                .fields
                .iter()
                .find(|(n, _)| *n == number)
                .map(|(_, k)| *k);
            let value_at = at;
            let skip = |len: usize| {
                value_at
                    .checked_add(len)
                    .filter(|&e| e <= end)
                    .ok_or(WireError::Truncated(tag_at))
            };
            match tag & 7 {
                0 => {
                    self.varint(&mut at)?;
                    if at > end {
                        return Err(WireError::Truncated(tag_at));
                    }
                    if let Some(Numbers(size)) = kind {
                        self.element(size);
                    }
                }
                1 | 5 => {
                    at = skip(if tag & 7 == 1 { 8 } else { 4 })?;
                    if let Some(Numbers(size) | Fixed(size)) = kind {
                        self.element(size);
                    }
                }
                2 => {
                    let len = self.varint(&mut at)?;
                    let len = usize::try_from(len).map_err(|_| WireError::Truncated(tag_at))?;
                    let body = at;
                    at = body
                        .checked_add(len)
                        .filter(|&e| e <= end)
                        .ok_or(WireError::Truncated(tag_at))?;
                    self.length_delimited(kind, body, at, depth)?;
                }
                _ => return Err(WireError::Tag(tag_at)),
            }
        }
        Ok(())
    }

    fn length_delimited(
        &mut self,
        kind: Option<Kind>,
        start: usize,
        end: usize,
        depth: u32,
    ) -> Result<(), WireError> {
        let len = end - start;
        match kind {
            None => {}
            Some(Messages(schema)) => {
                self.element(schema.size);
                self.message(schema, start, end, depth + 1)?;
            }
            Some(Message(schema)) => self.message(schema, start, end, depth + 1)?,
            Some(Bytes) => self.add(len.saturating_add(ALLOCATION_OVERHEAD)),
            Some(RepeatedBytes) => {
                self.element(size_of::<String>());
                self.add(len.saturating_add(ALLOCATION_OVERHEAD));
            }
            Some(Numbers(size)) => {
                // Packed: a byte without its high bit ends each varint.
                let elements = self.wire[start..end]
                    .iter()
                    .filter(|b| *b & 0x80 == 0)
                    .count();
                self.packed(elements, size);
            }
            Some(Fixed(size)) => self.packed(len / size.max(1), size),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::encode_request;
    use crate::test_fixtures;
    use prost::Message as _;

    #[test]
    fn malformed_bytes_are_refused() {
        assert_eq!(
            decoded_bytes(&[0x0a, 0x05, 1]),
            Err(WireError::Truncated(0))
        );
        assert_eq!(decoded_bytes(&[0x0b]), Err(WireError::Tag(0)));
        assert_eq!(decoded_bytes(&[0x00]), Err(WireError::Tag(0)));
        assert_eq!(decoded_bytes(&[0x08, 0xff]), Err(WireError::Varint(1)));
    }

    #[test]
    fn deep_nesting_is_refused() {
        // resource_profiles { resource { attributes { value { kvlist { values { value ... } } } } } }
        let mut inner: Vec<u8> = Vec::new();
        for _ in 0..200 {
            // AnyValue { array_value (5) { values (1) { inner } } }
            let mut array = vec![0x0a];
            push_len(&mut array, inner.len());
            array.extend_from_slice(&inner);
            let mut any = vec![0x2a];
            push_len(&mut any, array.len());
            any.extend_from_slice(&array);
            inner = any;
        }
        let mut kv = vec![0x12];
        push_len(&mut kv, inner.len());
        kv.extend_from_slice(&inner);
        let mut resource = vec![0x0a];
        push_len(&mut resource, kv.len());
        resource.extend_from_slice(&kv);
        let mut rp = vec![0x0a];
        push_len(&mut rp, resource.len());
        rp.extend_from_slice(&resource);
        let mut request = vec![0x0a];
        push_len(&mut request, rp.len());
        request.extend_from_slice(&rp);
        assert_eq!(decoded_bytes(&request), Err(WireError::TooDeep));
        assert!(ExportProfilesServiceRequest::decode(request.as_slice()).is_err());
    }

    fn push_len(out: &mut Vec<u8>, mut len: usize) {
        loop {
            let byte = (len & 0x7f) as u8;
            len >>= 7;
            if len == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }

    #[test]
    fn empty_messages_are_charged_their_decoded_size() {
        // 100,000 empty samples: 2 bytes each on the wire.
        let sample = [0x12u8, 0x00];
        let mut profile = Vec::new();
        for _ in 0..100_000 {
            profile.extend_from_slice(&sample);
        }
        let mut scope = vec![0x12];
        push_len(&mut scope, profile.len());
        scope.extend_from_slice(&profile);
        let mut rp = vec![0x12];
        push_len(&mut rp, scope.len());
        rp.extend_from_slice(&scope);
        let mut request = vec![0x0a];
        push_len(&mut request, rp.len());
        request.extend_from_slice(&rp);
        let cost = decoded_bytes(&request).unwrap();
        assert!(
            cost >= 100_000 * size_of::<Sample>(),
            "{cost} bytes for 100,000 samples of {} bytes",
            size_of::<Sample>()
        );
        assert!(cost > 20 * request.len(), "amplification is seen");
    }

    #[test]
    fn icecore_requests_cost_a_few_times_their_size() {
        let wire = encode_request(&test_fixtures::batch(), "1").encode_to_vec();
        let cost = decoded_bytes(&wire).unwrap();
        assert!(cost > wire.len(), "{cost} for {} wire bytes", wire.len());
    }
}
