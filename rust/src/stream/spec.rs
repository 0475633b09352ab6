//! The stream's geometry (`StreamSpec`: global batches, epochs, the rank slice) and the
//! synchronous assembly of one batch from it (rows in parallel on rayon's pool).

use crate::error::{Error, Result};
use crate::permutation::Permutation;
use crate::recordings::Dataset;

/// Validated stream geometry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamSpec {
    pub n: u64,
    pub batch_size: u64,
    pub seed: u64,
    pub rank: u64,
    pub world_size: u64,
}

impl StreamSpec {
    pub fn new(n: u64, batch_size: u64, seed: u64, rank: u64, world_size: u64) -> Result<Self> {
        if n == 0 {
            return Err(Error::config("dataset", "has no windows"));
        }
        if batch_size < 1 {
            return Err(Error::config(
                "batch_size",
                format!("must be >= 1, got {batch_size}"),
            ));
        }
        if world_size < 1 {
            return Err(Error::config(
                "world_size",
                format!("must be >= 1, got {world_size}"),
            ));
        }
        if rank >= world_size {
            return Err(Error::config(
                "rank",
                format!("must be < world_size ({world_size}), got {rank}"),
            ));
        }
        if batch_size % world_size != 0 {
            return Err(Error::config(
                "batch_size",
                format!("{batch_size} is not divisible by world_size {world_size}"),
            ));
        }
        Ok(StreamSpec {
            n,
            batch_size,
            seed,
            rank,
            world_size,
        })
    }

    /// Rows this rank receives per batch: `B / W`.
    pub fn local_rows(&self) -> u64 {
        self.batch_size / self.world_size
    }

    /// Checks that the global batch starting at `pos` is addressable.
    pub fn check_pos(&self, pos: u64) -> Result<()> {
        match pos.checked_add(self.batch_size) {
            Some(_) => Ok(()),
            None => Err(Error::config(
                "samples_consumed",
                format!(
                    "{pos} leaves no room for a batch of {} below 2^64",
                    self.batch_size
                ),
            )),
        }
    }

    /// Window ids of this rank's slice of the global batch at sample position `pos`.
    pub fn batch_ids(&self, pos: u64) -> Result<Vec<u64>> {
        self.check_pos(pos)?;
        let rows = self.local_rows();
        let first = pos + self.rank * rows;
        let mut ids = Vec::new();
        ids.try_reserve_exact(rows as usize)
            .map_err(|_| Error::Alloc {
                what: "batch ids",
                bytes: rows as u128 * 8,
            })?;
        // One permutation per epoch touched (a batch may straddle several).
        let mut perm: Option<(u64, Permutation)> = None;
        for g in first..first + rows {
            let (epoch, at) = (g / self.n, g % self.n);
            let p = match &perm {
                Some((e, p)) if *e == epoch => p,
                _ => {
                    &perm
                        .insert((epoch, Permutation::new(self.n, self.seed, epoch)))
                        .1
                }
            };
            ids.push(p.index(at));
        }
        Ok(ids)
    }
}

/// Assembles the batch at `pos` into `out` (exactly one batch of bytes); returns its ids.
pub(crate) fn assemble_into(
    ds: &Dataset,
    spec: &StreamSpec,
    pos: u64,
    out: &mut [u8],
) -> Result<Vec<u64>> {
    let ids = spec.batch_ids(pos)?;
    ds.gather(&ids, out)?;
    Ok(ids)
}
