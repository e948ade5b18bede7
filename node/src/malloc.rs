//! glibc's malloc, told to keep the memory of large request bodies (builds without the
//! `jemalloc` feature, on Linux with glibc).
//!
//! By default glibc serves a block above its mmap threshold (128 KiB, raised as such blocks are
//! freed) with a mapping of its own, unmapped when freed, and trims a heap whose free top
//! exceeds twice that threshold. A forwarded body of hundreds of kilobytes (a chat with an
//! image) then lands in fresh pages at every request, each first touch a page fault: page
//! faults, `brk` and `munmap` were a fifth of both sidecars' CPU on 256 KiB images, and two
//! hops cost such a request 0.35–0.9 ms more than with jemalloc
//! (`BENCHMARKS.md#media-overhead`). With the thresholds below, blocks up to 4 MiB come from
//! the heap and freed ones stay there for the next request. The price: up to
//! [`TRIM_THRESHOLD_BYTES`] of freed memory may stay mapped per heap after a burst of large
//! bodies.

/// Blocks above this get a mapping of their own (glibc's default starts at 128 KiB).
const MMAP_THRESHOLD_BYTES: i32 = 4 << 20;

/// A heap is given back to the kernel only past this much free memory at its top.
const TRIM_THRESHOLD_BYTES: i32 = 32 << 20;

/// Applies the thresholds (call before the runtime starts its threads); whether glibc took
/// them.
#[cfg(all(target_os = "linux", target_env = "gnu", not(feature = "jemalloc")))]
#[allow(unsafe_code)] // the workspace denies unsafe code; this one foreign call is the exception
pub fn keep_freed_bodies() -> bool {
    // SAFETY: `mallopt` sets allocator parameters under glibc's own lock; nothing else is
    // touched.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
            && libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1
    }
}

/// Nothing to tune: jemalloc, or another C library.
#[cfg(not(all(target_os = "linux", target_env = "gnu", not(feature = "jemalloc"))))]
pub fn keep_freed_bodies() -> bool {
    let _ = (MMAP_THRESHOLD_BYTES, TRIM_THRESHOLD_BYTES);
    true
}

#[cfg(test)]
mod tests {
    #[test]
    fn glibc_takes_the_thresholds() {
        assert!(super::keep_freed_bodies());
    }
}
