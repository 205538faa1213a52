//! A bounded cache of decompressed blocks, shared by threads.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

const SHARDS: usize = 16;

struct Shard {
    map: HashMap<u64, (Arc<Vec<u8>>, u64)>,
    /// insertion order, for eviction (first in, first out: what a sequential reader read first
    /// is what it needs least)
    order: VecDeque<u64>,
    bytes: usize,
}

/// Blocks keyed by their position in the image, at most about `capacity` bytes in all.
pub struct BlockCache {
    shards: Vec<Mutex<Shard>>,
    per_shard: usize,
    zeros: Mutex<Option<Arc<Vec<u8>>>>,
    /// lookups answered from the cache, and not
    pub hits: AtomicU64,
    pub misses: AtomicU64,
}

impl BlockCache {
    pub fn new(capacity: usize) -> BlockCache {
        BlockCache {
            shards: (0..SHARDS)
                .map(|_| {
                    Mutex::new(Shard {
                        map: HashMap::new(),
                        order: VecDeque::new(),
                        bytes: 0,
                    })
                })
                .collect(),
            per_shard: (capacity / SHARDS).max(1),
            zeros: Mutex::new(None),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    fn shard_index(pos: u64) -> usize {
        // positions of neighbouring blocks differ in their low bits
        let h = (pos ^ (pos >> 17) ^ (pos >> 29)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        (h >> 59) as usize % SHARDS
    }

    fn shard(&self, pos: u64) -> std::sync::MutexGuard<'_, Shard> {
        self.shards[Self::shard_index(pos)]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    pub fn get(&self, pos: u64) -> Option<Arc<Vec<u8>>> {
        self.get_meta(pos).map(|(d, _)| d)
    }

    pub fn contains(&self, pos: u64) -> bool {
        self.shard(pos).map.contains_key(&pos)
    }

    pub(crate) fn get_meta(&self, pos: u64) -> Option<(Arc<Vec<u8>>, u64)> {
        let r = self.shard(pos).map.get(&pos).cloned();
        if r.is_some() {
            self.hits.fetch_add(1, Ordering::Relaxed);
        } else {
            self.misses.fetch_add(1, Ordering::Relaxed);
        }
        r
    }

    pub fn put(&self, pos: u64, data: Arc<Vec<u8>>) {
        self.put_meta(pos, data, 0)
    }

    pub(crate) fn put_meta(&self, pos: u64, data: Arc<Vec<u8>>, next: u64) {
        let mut s = self.shard(pos);
        let len = data.len().max(64);
        if let Some((old, _)) = s.map.insert(pos, (data, next)) {
            // put again (two threads missed it at once; in a crafted image, two files may name the
            // same position with different sizes): count the block kept, not the one replaced,
            // or eviction subtracts more than was added
            s.bytes = s.bytes - old.len().max(64) + len;
            return;
        }
        s.order.push_back(pos);
        s.bytes += len;
        while s.bytes > self.per_shard && s.order.len() > 1 {
            let Some(old) = s.order.pop_front() else {
                break;
            };
            if let Some((d, _)) = s.map.remove(&old) {
                s.bytes -= d.len().max(64);
            }
        }
    }

    /// A block of `n` zero bytes (a sparse file's hole), shared.
    pub fn zeros(&self, n: usize) -> Arc<Vec<u8>> {
        let mut z = self.zeros.lock().unwrap_or_else(|p| p.into_inner());
        match &*z {
            Some(v) if v.len() == n => v.clone(),
            _ => {
                let v = Arc::new(vec![0u8; n]);
                *z = Some(v.clone());
                v
            }
        }
    }

    /// Bytes held now.
    pub fn bytes(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|p| p.into_inner()).bytes)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(n: usize) -> Arc<Vec<u8>> {
        Arc::new(vec![7u8; n])
    }

    #[test]
    fn a_block_put_again_with_another_size_is_counted_once() {
        let c = BlockCache::new(16 * 10_000);
        c.put(4096, block(100));
        c.put(4096, block(9000));
        assert_eq!(c.bytes(), 9000);
        c.put(4096, block(100));
        assert_eq!(c.bytes(), 100);
        assert_eq!(c.get(4096).map(|b| b.len()), Some(100));
    }

    #[test]
    fn eviction_after_a_replaced_block_keeps_the_count() {
        // one shard's worth is 1,000 bytes: the block replaced by a larger one is evicted by the
        // next put, which subtracted the larger size from the smaller count before
        let c = BlockCache::new(16 * 1_000);
        let pos = 1 << 20;
        c.put(pos, block(64));
        c.put(pos, block(900));
        // another position in the same shard
        let other = (1u64..)
            .map(|i| pos + i * 4096)
            .find(|&p| BlockCache::shard_index(p) == BlockCache::shard_index(pos))
            .unwrap();
        c.put(other, block(800));
        assert!(!c.contains(pos));
        assert_eq!(c.bytes(), 800);
    }
}
