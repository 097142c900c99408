//! The rANS decoder: reads a payload's source, context map and tables (every count and length
//! checked before use), builds the decoding slots and decodes the four lanes in lockstep.

use super::{
    corrupt, lanes, BitReader, Result, Source, Sources, BIN, BIN_TOTAL, FLAG_BINNED, FLAG_NIBBLE, FLAG_PACKED,
    FLAG_SOURCE, L, LANES, MAX_CONTEXTS, MAX_EG_ORDER, SCALE_BITS, SLOTS, SLOT_COUNT, TOTAL,
};

/// Reads a LEB128 varint of at most `max` from `input` at `*at`.
fn get_varint(input: &[u8], at: &mut usize, max: u64) -> Result<u64> {
    let mut v = 0u64;
    for shift in (0..).step_by(7).take(10) {
        let b = *input.get(*at).ok_or_else(|| corrupt("cut short in its tables"))?;
        *at += 1;
        v |= u64::from(b & 0x7F) << shift;
        if b & 0x80 == 0 {
            break;
        }
        if shift >= 56 {
            return Err(corrupt("varint too long"));
        }
    }
    if v > max {
        return Err(corrupt("value out of range"));
    }
    Ok(v)
}

/// One lane being decoded.
#[derive(Clone, Copy)]
struct Lane<'a> {
    x: u32,
    words: &'a [u8],
    at: usize,
    /// Offset of the current context's table in the slot tables (previous-byte contexts).
    table: usize,
}

impl Lane<'_> {
    /// Decodes one symbol with the table at offset `table`.
    #[inline(always)]
    fn step_in(&mut self, slots: &[u32; SLOT_COUNT], table: usize) -> Result<u8> {
        // `table` is a multiple of 4096 below SLOT_COUNT: the mask only drops the bounds check.
        let e = slots[(table | (self.x & (TOTAL - 1)) as usize) & (SLOT_COUNT - 1)];
        let s = (e >> 24) as u8;
        self.x = ((e & 0xFFF) + 1) * (self.x >> SCALE_BITS) + ((e >> 12) & 0xFFF);
        if self.x < L {
            let w = self.words.get(self.at..self.at + 2).ok_or_else(|| corrupt("stream cut short"))?;
            self.x = (self.x << 16) | u32::from(u16::from_le_bytes([w[0], w[1]]));
            self.at += 2;
        }
        Ok(s)
    }

    /// Decodes one symbol in the context of the lane's previous one.
    #[inline(always)]
    fn step(&mut self, slots: &[u32; SLOT_COUNT], context_of: &[u32; 256]) -> Result<u8> {
        let s = self.step_in(slots, self.table)?;
        self.table = context_of[s as usize] as usize;
        Ok(s)
    }
}

/// Decodes a rANS payload whose contexts are the previous byte (any format-4 payload) into
/// `out`; see [`decode_with_sources`].
pub fn decode(stored: &[u8], out: &mut [u8]) -> Result<()> {
    decode_with_sources(stored, out, &Sources::default())
}

/// Decodes a rANS payload into `out` (the group; its length is the caller's), taking a context
/// source's bytes from `sources`. Every count and length read from `stored` is checked before
/// use; tables are bounded (16 × 4096 entries); a source that `sources` lacks, or of another
/// length than the group, is an error; and a payload that does not end exactly where its final
/// states say is corrupt.
pub fn decode_with_sources(stored: &[u8], out: &mut [u8], sources: &Sources<'_>) -> Result<()> {
    let head = *stored.first().ok_or_else(|| corrupt("empty payload"))?;
    let mut at = 1usize;
    let k = (head & 0x0F) as usize;
    let source_bytes = read_source(stored, &mut at, head, sources, out.len())?;
    let context_of = read_context_map(stored, &mut at, head, k)?;
    let tables = read_tables(stored, &mut at, head, k)?;
    SLOTS.with(|cell| {
        let mut slots = cell.borrow_mut();
        // Sized once per thread: each table used is written whole below (its frequencies add
        // up to 4096), so what other groups left in the rest is never read.
        slots.resize(SLOT_COUNT, 0);
        fill_slots(&mut slots, &tables)?;
        let state = read_lanes(stored, at)?;
        let slots: &[u32; SLOT_COUNT] = slots[..].try_into().expect("slots are SLOT_COUNT long");
        decode_lanes(slots, &context_of, state, source_bytes, out)
    })
}

/// The bytes of the payload's context source, if its head says it has one: read from
/// `sources`, checked to be `len` long (the group's length).
fn read_source<'s>(
    stored: &[u8],
    at: &mut usize,
    head: u8,
    sources: &Sources<'s>,
    len: usize,
) -> Result<Option<&'s [u8]>> {
    if head & FLAG_SOURCE == 0 {
        return Ok(None);
    }
    let tag = *stored.get(*at).ok_or_else(|| corrupt("cut short in its source"))?;
    *at += 1;
    let source = Source::from_tag(tag)?;
    let bytes = sources.get(source).ok_or_else(|| corrupt(&format!("context source {source:?} is not available")))?;
    if bytes.len() != len {
        return Err(corrupt("context source and group lengths differ"));
    }
    Ok(Some(bytes))
}

/// The context map of a payload with `k` dedicated contexts: for each context byte, its
/// table's offset in the slot tables.
fn read_context_map(stored: &[u8], at: &mut usize, head: u8, k: usize) -> Result<[u32; 256]> {
    let mut context_of = [0u32; 256];
    if head & FLAG_NIBBLE != 0 {
        if k != MAX_CONTEXTS {
            return Err(corrupt("nibble contexts need 16 tables"));
        }
        for (b, slot) in context_of.iter_mut().enumerate() {
            *slot = ((b >> 4) as u32) << SCALE_BITS;
        }
    } else {
        let context_bytes = stored.get(*at..*at + k).ok_or_else(|| corrupt("cut short in its contexts"))?;
        *at += k;
        for (i, &b) in context_bytes.iter().enumerate() {
            context_of[b as usize] = ((i + 1) as u32) << SCALE_BITS;
        }
    }
    Ok(context_of)
}

/// A payload's frequency tables as stored: the alphabet and each table's frequency per
/// alphabet entry, context 0 first.
struct Tables {
    alphabet: Vec<usize>,
    values: Vec<u32>,
    /// Symbols per alphabet entry: 1, or [`BIN`] when binned.
    per_entry: usize,
}

/// Reads the alphabet and the `k + 1` frequency tables, bit-packed or as varints.
fn read_tables(stored: &[u8], at: &mut usize, head: u8, k: usize) -> Result<Tables> {
    let binned = head & FLAG_BINNED != 0;
    let (entries, per_entry, entry_max) = if binned { (256 / BIN, BIN, BIN_TOTAL) } else { (256, 1, TOTAL) };
    let alphabet: Vec<usize>;
    let mut values: Vec<u32> = Vec::new();
    if head & FLAG_PACKED != 0 {
        let [first, last] = *stored
            .get(*at..*at + 2)
            .and_then(|b| b.first_chunk::<2>())
            .ok_or_else(|| corrupt("cut short in its alphabet"))?;
        *at += 2;
        let (first, last) = (first as usize, last as usize);
        if first > last || last >= entries {
            return Err(corrupt("bad alphabet span"));
        }
        let mut bits = BitReader { bytes: &stored[*at..], bit: 0 };
        let mut present = Vec::new();
        for a in first..=last {
            if bits.get(1)? == 1 {
                present.push(a);
            }
        }
        alphabet = present;
        for _ in 0..=k {
            let order = bits.get(4)?;
            if order > MAX_EG_ORDER {
                return Err(corrupt("Exp-Golomb order out of range"));
            }
            for _ in &alphabet {
                values.push(bits.get_eg(order, entry_max)?);
            }
        }
        *at += bits.bytes_used();
    } else {
        let bitmap = stored.get(*at..*at + entries / 8).ok_or_else(|| corrupt("cut short in its alphabet"))?;
        *at += entries / 8;
        alphabet = (0..entries).filter(|&a| bitmap[a / 8] & (1 << (a % 8)) != 0).collect();
        for _ in 0..=k {
            for _ in &alphabet {
                values.push(get_varint(stored, at, u64::from(entry_max))? as u32);
            }
        }
    }
    if alphabet.is_empty() {
        return Err(corrupt("empty alphabet"));
    }
    Ok(Tables { alphabet, values, per_entry })
}

/// Writes each table's decoding slots (symbol, bias, frequency) into `slots`, checking that its
/// frequencies add up to the total.
fn fill_slots(slots: &mut [u32], tables: &Tables) -> Result<()> {
    let Tables { alphabet, values, per_entry } = tables;
    for (c, table_values) in values.chunks_exact(alphabet.len()).enumerate() {
        let table = &mut slots[c << SCALE_BITS..(c + 1) << SCALE_BITS];
        let mut cum = 0u32;
        for (&a, &f) in alphabet.iter().zip(table_values) {
            for s in a * per_entry..(a + 1) * per_entry {
                if cum + f > TOTAL {
                    return Err(corrupt("frequencies over the total"));
                }
                for (bias, slot) in table[cum as usize..(cum + f) as usize].iter_mut().enumerate() {
                    *slot = ((s as u32) << 24) | ((bias as u32) << 12) | (f.max(1) - 1);
                }
                cum += f;
            }
        }
        if cum != TOTAL {
            return Err(corrupt("frequencies do not add up to the total"));
        }
    }
    Ok(())
}

/// The four lanes at `at` in `stored` (the lane lengths, then the streams), each checked to
/// start in a valid state.
fn read_lanes(stored: &[u8], mut at: usize) -> Result<[Lane<'_>; LANES]> {
    let mut lengths = [0usize; LANES];
    for len in &mut lengths[..LANES - 1] {
        *len = get_varint(stored, &mut at, stored.len() as u64)? as usize;
    }
    let mut rest = &stored[at..];
    let used: usize = lengths[..LANES - 1].iter().sum();
    lengths[LANES - 1] = rest.len().checked_sub(used).ok_or_else(|| corrupt("lanes longer than the payload"))?;
    let mut lanes = [Lane { x: 0, words: &[], at: 0, table: 0 }; LANES];
    for (lane, len) in lanes.iter_mut().zip(lengths) {
        let (stream, tail) = rest.split_at(len);
        rest = tail;
        let (x, words) = stream.split_first_chunk::<4>().ok_or_else(|| corrupt("lane without a state"))?;
        *lane = Lane { x: u32::from_le_bytes(*x), words, at: 0, table: 0 };
    }
    for lane in &lanes {
        if !(L..=u32::MAX).contains(&lane.x) || lane.words.len() % 2 != 0 {
            return Err(corrupt("bad lane state"));
        }
    }
    Ok(lanes)
}

/// Decodes the four lanes from their starting `state` into `out`, their contexts from `source_bytes` or else each lane's
/// previous symbol, and checks that every lane ends where its stream does. The decoder's
/// kernel: one function, so the lanes' states stay in registers through the loops.
fn decode_lanes(
    slots: &[u32; SLOT_COUNT],
    context_of: &[u32; 256],
    state: [Lane<'_>; LANES],
    source_bytes: Option<&[u8]>,
    out: &mut [u8],
) -> Result<()> {
    let ranges = lanes(out.len());
    // Lane lengths do not increase from lane 0 to lane 3.
    let (o0, rest_out) = out.split_at_mut(ranges[0].len());
    let (o1, rest_out) = rest_out.split_at_mut(ranges[1].len());
    let (o2, o3) = rest_out.split_at_mut(ranges[2].len());
    let shortest = o3.len();
    // The lanes as locals, so their states can live in registers through the loops.
    let [mut l0, mut l1, mut l2, mut l3] = state;
    // All four lanes in lockstep while the last (shortest) has symbols, then the rest. The
    // lockstep slices are cut to one length first, which takes the bounds checks out of it.
    let (s0, s1, s2, s3) = (&mut o0[..shortest], &mut o1[..shortest], &mut o2[..shortest], &mut o3[..]);
    match source_bytes {
        None => {
            let start = context_of[0] as usize;
            for lane in [&mut l0, &mut l1, &mut l2, &mut l3] {
                lane.table = start;
            }
            for i in 0..shortest {
                s0[i] = l0.step(slots, context_of)?;
                s1[i] = l1.step(slots, context_of)?;
                s2[i] = l2.step(slots, context_of)?;
                s3[i] = l3.step(slots, context_of)?;
            }
            for (lane, o) in [(&mut l0, o0), (&mut l1, o1), (&mut l2, o2)] {
                for b in o[shortest..].iter_mut() {
                    *b = lane.step(slots, context_of)?;
                }
            }
        }
        Some(src) => {
            // Contexts are known ahead: no lane waits for its previous symbol's context.
            let [c0, c1, c2, c3] = ranges.map(|r| &src[r]);
            let (t0, t1, t2, t3) = (&c0[..shortest], &c1[..shortest], &c2[..shortest], &c3[..shortest]);
            for i in 0..shortest {
                s0[i] = l0.step_in(slots, context_of[t0[i] as usize] as usize)?;
                s1[i] = l1.step_in(slots, context_of[t1[i] as usize] as usize)?;
                s2[i] = l2.step_in(slots, context_of[t2[i] as usize] as usize)?;
                s3[i] = l3.step_in(slots, context_of[t3[i] as usize] as usize)?;
            }
            for (lane, o, c) in [(&mut l0, o0, c0), (&mut l1, o1, c1), (&mut l2, o2, c2)] {
                for (b, &cb) in o[shortest..].iter_mut().zip(&c[shortest..]) {
                    *b = lane.step_in(slots, context_of[cb as usize] as usize)?;
                }
            }
        }
    }
    for lane in [&l0, &l1, &l2, &l3] {
        if lane.x != L || lane.at != lane.words.len() {
            return Err(corrupt("lane does not end in the initial state"));
        }
    }
    Ok(())
}
