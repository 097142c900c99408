//! The numbers of one heatmap cell: how a tensor changed between two contents, summed element
//! by element over aligned slices as they are decoded, so a tensor is never whole in memory.
//!
//! Relative change is ‖new − old‖₂ / ‖old‖₂ over the finite elements, for the float dtypes
//! (bf16, fp16, fp32, fp64); every dtype gets the fraction of elements whose bits changed.
//! Elements where either value is NaN or infinite are counted apart (`non_finite`) and left out
//! of both sums, so one NaN does not hide how the rest moved.

use crate::dtype::Dtype;
use crate::index::ChangeRecord;
use rayon::prelude::*;

/// Slices larger than this are summed in parallel pieces of this size.
const PIECE: usize = 1 << 20;

/// Sums of the change of one tensor between two contents (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Change {
    /// Elements compared.
    pub elements: u64,
    /// Elements whose bits differ.
    pub changed: u64,
    /// Elements where either value is NaN or infinite (left out of both sums).
    pub non_finite: u64,
    /// Σ (new − old)² over the finite elements.
    pub sum_sq_diff: f64,
    /// Σ old² over the finite elements.
    pub sum_sq_prev: f64,
}

impl Change {
    /// Adds aligned slices of the old and new content (whole elements of `dtype`, equal lengths).
    pub fn add(&mut self, dtype: Dtype, old: &[u8], new: &[u8]) {
        let width = dtype.size();
        let n = old.len().min(new.len()) / width * width;
        let (old, new) = (&old[..n], &new[..n]);
        let piece = (PIECE / width).max(1) * width;
        let part = if n > piece {
            old.par_chunks(piece).zip(new.par_chunks(piece)).map(|(a, b)| sums(dtype, a, b)).reduce(
                Change::default,
                |mut x, y| {
                    x.merge(&y);
                    x
                },
            )
        } else {
            sums(dtype, old, new)
        };
        self.merge(&part);
    }

    /// Adds another slice's sums.
    pub fn merge(&mut self, o: &Change) {
        self.elements += o.elements;
        self.changed += o.changed;
        self.non_finite += o.non_finite;
        self.sum_sq_diff += o.sum_sq_diff;
        self.sum_sq_prev += o.sum_sq_prev;
    }

    /// ‖new − old‖₂ / ‖old‖₂, for float dtypes; `None` for others, and when the old content is
    /// all zeros (or non-finite) but the new one is not (no finite ratio).
    pub fn rel_change(&self, dtype: Dtype) -> Option<f64> {
        if !is_float(dtype) {
            return None;
        }
        if self.sum_sq_diff == 0.0 {
            return Some(0.0);
        }
        (self.sum_sq_prev > 0.0).then(|| (self.sum_sq_diff / self.sum_sq_prev).sqrt())
    }

    /// The fraction of elements whose bits changed (`None` for an empty tensor).
    pub fn frac_changed(&self) -> Option<f64> {
        (self.elements > 0).then(|| self.changed as f64 / self.elements as f64)
    }

    /// The index's form of these sums.
    pub(crate) fn record(&self) -> ChangeRecord {
        ChangeRecord {
            elements: self.elements,
            changed: self.changed,
            non_finite: self.non_finite,
            sum_sq_diff: self.sum_sq_diff,
            sum_sq_prev: self.sum_sq_prev,
        }
    }

    /// Sums read back from the index.
    pub(crate) fn from_record(r: &ChangeRecord) -> Change {
        Change {
            elements: r.elements,
            changed: r.changed,
            non_finite: r.non_finite,
            sum_sq_diff: r.sum_sq_diff,
            sum_sq_prev: r.sum_sq_prev,
        }
    }
}

/// Whether relative change is computed for `dtype` (the others get the fraction changed only).
pub fn is_float(dtype: Dtype) -> bool {
    matches!(dtype, Dtype::Bf16 | Dtype::F16 | Dtype::F32 | Dtype::F64)
}

/// The sums of one slice pair, on this thread.
fn sums(dtype: Dtype, old: &[u8], new: &[u8]) -> Change {
    match dtype {
        Dtype::F32 => float_sums::<4>(old, new, |b| f32::from_le_bytes(b) as f64),
        Dtype::F64 => float_sums::<8>(old, new, f64::from_le_bytes),
        Dtype::Bf16 => float_sums::<2>(old, new, |b| f32::from_bits(u32::from(u16::from_le_bytes(b)) << 16) as f64),
        Dtype::F16 => {
            let table = f16_table();
            float_sums::<2>(old, new, |b| table[usize::from(u16::from_le_bytes(b))] as f64)
        }
        _ => {
            let width = dtype.size();
            let changed = old.chunks_exact(width).zip(new.chunks_exact(width)).filter(|(a, b)| a != b).count();
            Change { elements: (old.len() / width) as u64, changed: changed as u64, ..Change::default() }
        }
    }
}

/// Elements summed side by side in [`float_sums`]: independent accumulators let the loop run
/// without a branch or a serial dependency per element, so the compiler vectorizes it (the
/// element-at-a-time loop was 40% of a report's CPU after one more commit).
const LANES: usize = 8;

/// [`sums`] for a float dtype of `W` bytes whose element value `value` gives.
fn float_sums<const W: usize>(old: &[u8], new: &[u8], value: impl Fn([u8; W]) -> f64 + Copy) -> Change {
    let mut lanes = FloatLanes::default();
    let (old_blocks, new_blocks) = (old.chunks_exact(W * LANES), new.chunks_exact(W * LANES));
    let (old_rest, new_rest) = (old_blocks.remainder(), new_blocks.remainder());
    for (a, b) in old_blocks.zip(new_blocks) {
        for lane in 0..LANES {
            let at = lane * W;
            let (x, y): ([u8; W], [u8; W]) =
                (a[at..at + W].try_into().expect("W bytes"), b[at..at + W].try_into().expect("W bytes"));
            lanes.add(lane, x != y, value(x), value(y));
        }
    }
    for (a, b) in old_rest.chunks_exact(W).zip(new_rest.chunks_exact(W)) {
        let (x, y): ([u8; W], [u8; W]) = (a.try_into().expect("W bytes"), b.try_into().expect("W bytes"));
        lanes.add(0, x != y, value(x), value(y));
    }
    lanes.total((old.len().min(new.len()) / W) as u64)
}

/// [`LANES`] partial sums of [`float_sums`].
#[derive(Default)]
struct FloatLanes {
    changed: [u64; LANES],
    non_finite: [u64; LANES],
    sum_sq_diff: [f64; LANES],
    sum_sq_prev: [f64; LANES],
}

impl FloatLanes {
    /// Adds one element pair to lane `lane`, without a branch.
    #[inline(always)]
    fn add(&mut self, lane: usize, changed: bool, x: f64, y: f64) {
        let finite = x.is_finite() & y.is_finite();
        self.changed[lane] += u64::from(changed);
        self.non_finite[lane] += u64::from(!finite);
        let (d, x) = if finite { (y - x, x) } else { (0.0, 0.0) };
        self.sum_sq_diff[lane] += d * d;
        self.sum_sq_prev[lane] += x * x;
    }

    fn total(&self, elements: u64) -> Change {
        Change {
            elements,
            changed: self.changed.iter().sum(),
            non_finite: self.non_finite.iter().sum(),
            sum_sq_diff: self.sum_sq_diff.iter().sum(),
            sum_sq_prev: self.sum_sq_prev.iter().sum(),
        }
    }
}

/// Every fp16 value as f32, by bit pattern (256 KiB, built once from the crate's conversion).
fn f16_table() -> &'static [f32] {
    static TABLE: std::sync::OnceLock<Vec<f32>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|h| crate::repo::to_f64(Dtype::F16, &h.to_le_bytes()).expect("fp16 converts") as f32)
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(dtype: Dtype, values: &[f64]) -> Vec<u8> {
        values
            .iter()
            .flat_map(|&v| match dtype {
                Dtype::F32 => (v as f32).to_le_bytes().to_vec(),
                Dtype::F64 => v.to_le_bytes().to_vec(),
                Dtype::Bf16 => (((v as f32).to_bits() >> 16) as u16).to_le_bytes().to_vec(),
                Dtype::F16 => f16_bits(v as f32).to_le_bytes().to_vec(),
                _ => unreachable!(),
            })
            .collect()
    }

    /// f32 to fp16 bits, truncating (test values are in fp16's normal range).
    fn f16_bits(v: f32) -> u16 {
        let b = v.to_bits();
        let sign = ((b >> 16) & 0x8000) as u16;
        let exp = ((b >> 23) & 0xff) as i32 - 127 + 15;
        let man = ((b >> 13) & 0x3ff) as u16;
        sign | ((exp as u16) << 10) | man
    }

    #[test]
    fn relative_change_and_fraction_match_the_straightforward_computation() {
        // Weights near ±0.05 and a step that moves every third element.
        let old: Vec<f64> = (0..3000).map(|i| ((i * 7919 % 1000) as f64 - 500.0) / 10_000.0 + 0.001).collect();
        let new: Vec<f64> =
            old.iter().enumerate().map(|(i, v)| if i % 3 == 0 { v * 1.01 + 1e-3 } else { *v }).collect();
        for dtype in [Dtype::Bf16, Dtype::F16, Dtype::F32, Dtype::F64] {
            let (a, b) = (encode(dtype, &old), encode(dtype, &new));
            // Added in uneven slices, as windows arrive.
            let mut c = Change::default();
            let cut = 1000 * dtype.size();
            c.add(dtype, &a[..cut], &b[..cut]);
            c.add(dtype, &a[cut..], &b[cut..]);
            let (rel, frac) = crate::report::tests::expected(dtype, &a, &b);
            let got = c.rel_change(dtype).unwrap();
            assert!((got - rel.unwrap()).abs() <= 1e-12 * rel.unwrap(), "{dtype:?}: {got} vs {rel:?}");
            assert_eq!(c.frac_changed(), Some(frac), "{dtype:?}");
            assert!(frac > 0.3 && frac < 0.34, "{dtype:?}: {frac}");
            assert_eq!((c.elements, c.non_finite), (3000, 0));
        }
    }

    #[test]
    fn large_slices_sum_in_parallel_to_the_same_figures() {
        let old: Vec<u8> = (0..3 * PIECE as u32 / 4).flat_map(|i| ((i % 977) as f32 * 0.01).to_le_bytes()).collect();
        let new: Vec<u8> =
            (0..3 * PIECE as u32 / 4).flat_map(|i| ((i % 977) as f32 * 0.01 + (i % 5) as f32).to_le_bytes()).collect();
        let mut whole = Change::default();
        whole.add(Dtype::F32, &old, &new);
        let one = sums(Dtype::F32, &old, &new);
        assert_eq!((whole.elements, whole.changed), (one.elements, one.changed));
        assert!((whole.sum_sq_diff - one.sum_sq_diff).abs() <= 1e-9 * one.sum_sq_diff);
    }

    #[test]
    fn nan_and_infinity_are_counted_apart_and_other_dtypes_get_the_fraction_only() {
        let old = encode(Dtype::F32, &[1.0, 2.0, 3.0, 4.0]);
        let new = encode(Dtype::F32, &[1.0, f64::NAN, 3.0, f64::INFINITY]);
        let mut c = Change::default();
        c.add(Dtype::F32, &old, &new);
        assert_eq!((c.changed, c.non_finite), (2, 2));
        assert_eq!(c.rel_change(Dtype::F32), Some(0.0));
        assert_eq!(c.frac_changed(), Some(0.5));

        let mut i = Change::default();
        i.add(Dtype::I32, &[1, 0, 0, 0, 2, 0, 0, 0], &[1, 0, 0, 0, 3, 0, 0, 0]);
        assert_eq!((i.rel_change(Dtype::I32), i.frac_changed()), (None, Some(0.5)));

        // From all zeros: no finite ratio; unchanged zeros: no change.
        let zeros = encode(Dtype::F32, &[0.0, 0.0]);
        let mut z = Change::default();
        z.add(Dtype::F32, &zeros, &encode(Dtype::F32, &[0.0, 1.0]));
        assert_eq!(z.rel_change(Dtype::F32), None);
        let mut same = Change::default();
        same.add(Dtype::F32, &zeros, &zeros);
        assert_eq!(same.rel_change(Dtype::F32), Some(0.0));
        assert_eq!(Change::default().frac_changed(), None);
        assert_eq!(Change::from_record(&c.record()), c);
    }
}
