//! The daemon's allocator and what it says about the heap.
//!
//! The `domaind` binary makes [`Allocator`] its global allocator; jemalloc is built
//! unprefixed, so it is the C library's `malloc` too (zstd's contexts). [`record`] sets the
//! heap gauges from jemalloc's statistics (the node daemon calls it every 10 s).
//! Resident memory alone cannot tell a leak (allocations held) from the allocator
//! keeping freed pages; the two gauges can.

use metrics::{describe_gauge, gauge};
use tikv_jemalloc_ctl::{background_thread, epoch, max_background_threads, stats};

/// The global allocator of the daemon's binary.
pub type Allocator = tikv_jemallocator::Jemalloc;

/// Bytes the process's live allocations hold.
pub const HEAP_ALLOCATED_BYTES: &str = "domaind_heap_allocated_bytes";
/// Bytes of the allocator's pages in memory: live allocations, the allocator's own
/// bookkeeping, and freed pages not yet given back.
pub const HEAP_RESIDENT_BYTES: &str = "domaind_heap_resident_bytes";
/// Bytes of the pages that hold live allocations: beyond the allocated bytes, the free
/// slots on pages a live allocation keeps (fragmentation).
pub const HEAP_ACTIVE_BYTES: &str = "domaind_heap_active_bytes";
/// Bytes of the allocator's own bookkeeping.
pub const HEAP_METADATA_BYTES: &str = "domaind_heap_metadata_bytes";

pub fn describe() {
    describe_gauge!(
        HEAP_ALLOCATED_BYTES,
        "Bytes held by the daemon's live allocations (jemalloc's `stats.allocated`, read every \
         10 s). Growth here that does not come back is a leak."
    );
    describe_gauge!(
        HEAP_RESIDENT_BYTES,
        "Bytes of the allocator's pages in memory (jemalloc's `stats.resident`): the live \
         allocations, the allocator's metadata, and freed pages not yet given back to the \
         system (within seconds)."
    );
    describe_gauge!(
        HEAP_ACTIVE_BYTES,
        "Bytes of the allocator's pages that hold live allocations (jemalloc's \
         `stats.active`); above the allocated bytes, free slots on pages still in use: \
         fragmentation."
    );
    describe_gauge!(
        HEAP_METADATA_BYTES,
        "Bytes of the allocator's own bookkeeping (jemalloc's `stats.metadata`)."
    );
}

/// Starts jemalloc's background threads, which give freed pages back to the system on
/// their decay schedule (10 s) even when the process allocates nothing. Without them
/// decay runs only inside allocator calls, so a daemon that went quiet after a burst
/// (a peer's restart, a domain formed) keeps the burst's pages resident.
/// One thread purges every arena: jemalloc would start one per CPU, up to 144 on a
/// GB200 node, for a daemon whose heap is a few megabytes.
pub fn purge_in_background() -> Result<(), tikv_jemalloc_ctl::Error> {
    max_background_threads::write(1)?;
    background_thread::write(true)
}

/// The heap as jemalloc counts it now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heap {
    pub allocated: usize,
    pub active: usize,
    pub metadata: usize,
    pub resident: usize,
}

/// Reads jemalloc's statistics, refreshed first (they are cached per epoch).
pub fn read() -> Result<Heap, tikv_jemalloc_ctl::Error> {
    epoch::advance()?;
    Ok(Heap {
        allocated: stats::allocated::read()?,
        active: stats::active::read()?,
        metadata: stats::metadata::read()?,
        resident: stats::resident::read()?,
    })
}

/// Sets the heap gauges; a failed read leaves them as they were and says why.
pub fn record() {
    match read() {
        Ok(heap) => {
            gauge!(HEAP_ALLOCATED_BYTES).set(heap.allocated as f64);
            gauge!(HEAP_ACTIVE_BYTES).set(heap.active as f64);
            gauge!(HEAP_METADATA_BYTES).set(heap.metadata as f64);
            gauge!(HEAP_RESIDENT_BYTES).set(heap.resident as f64);
        }
        Err(error) => tracing::warn!(%error, "cannot read the allocator's statistics"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[global_allocator]
    static ALLOCATOR: Allocator = Allocator {};

    #[test]
    fn allocations_of_rust_and_of_c_show_in_the_allocated_bytes() {
        // The test harness's other threads allocate and free meanwhile: the margins
        // (a quarter of the block) are for them.
        const SIZE: usize = 64 << 20;
        const MARGIN: usize = SIZE / 4;
        let before = read().expect("jemalloc's statistics").allocated;
        let block = vec![1_u8; SIZE];
        let during = read().expect("jemalloc's statistics");
        assert!(
            during.allocated + MARGIN >= before + SIZE,
            "{before} before, {} with 64 MiB held",
            during.allocated
        );
        assert!(during.active >= SIZE, "{during:?}");
        assert!(
            during.resident >= during.active && during.metadata > 0,
            "{during:?}"
        );
        drop(block);
        let after = read().expect("jemalloc's statistics").allocated;
        assert!(
            after + SIZE <= during.allocated + MARGIN,
            "{after} after freeing, {} with the block",
            during.allocated
        );

        // The C library's malloc is jemalloc's too: a zstd context at level 19 with no
        // size pledged holds a window of megabytes. (In this test, not another: the
        // block above would come and go in the middle of it.)
        const CONTEXT: usize = 4 << 20;
        let before = read().expect("jemalloc's statistics").allocated;
        let mut encoder = zstd::stream::Encoder::new(Vec::new(), 19).expect("a zstd context");
        std::io::Write::write_all(&mut encoder, &[7_u8; 1 << 16]).expect("compressing");
        let during = read().expect("jemalloc's statistics").allocated;
        drop(encoder);
        assert!(
            during + MARGIN / 16 >= before + CONTEXT,
            "{before} before, {during} with a level-19 zstd context held"
        );
    }

    #[test]
    fn jemalloc_is_built_with_one_arena() {
        // The workspace's `.cargo/config.toml` sets it when jemalloc is built; a build
        // without it would make four arenas per CPU. jemalloc counts one more in either
        // setting: its own arena for allocations over 8 MiB (`narenas:3` reads 4).
        assert_eq!(
            tikv_jemalloc_ctl::arenas::narenas::read().expect("the arena count"),
            2
        );
    }

    #[test]
    fn background_purging_can_be_turned_on() {
        purge_in_background().expect("jemalloc's background threads");
        assert!(background_thread::read().expect("the background_thread setting"));
        assert_eq!(max_background_threads::read().expect("its thread limit"), 1);
    }
}
