//! Opening a call's keys and reading their values, with the one rule that
//! keeps it safe: a call names each key once. Two handles on one key would
//! let one free the value the other still points to.

use std::collections::HashSet;
use std::ptr::NonNull;

use redis_module::raw::RedisModuleString;
use rl_core::INLINE;
use smallvec::SmallVec;

use super::{handle, Value};
use crate::ffi::{self, Ctx, Held, Key};

pub(crate) fn wrongtype() -> String {
    "WRONGTYPE Operation against a key holding the wrong kind of value".into()
}

/// The keys of one call, each named once: the only way to [`load`] keys.
/// Its one constructor checks, so a command that forgets cannot open two
/// handles on one key.
#[derive(Clone, Copy)]
pub(crate) struct DistinctKeys<'a>(&'a [*mut RedisModuleString]);

impl<'a> DistinctKeys<'a> {
    /// `names`, or the name given twice.
    pub fn new(names: &'a [*mut RedisModuleString]) -> Result<Self, &'a [u8]> {
        Self::checked(names, |n| ffi::bytes(n))
    }

    /// `new`, reading each name with `name_of`.
    fn checked(
        names: &'a [*mut RedisModuleString],
        name_of: impl Fn(*mut RedisModuleString) -> &'a [u8] + Clone,
    ) -> Result<Self, &'a [u8]> {
        if names.len() > 1 {
            distinct(names.iter().map(move |&n| name_of(n)))?;
        }
        Ok(Self(names))
    }

    pub fn names(&self) -> &'a [*mut RedisModuleString] {
        self.0
    }

    /// Opens every key (write: for writing).
    pub fn open(&self, ctx: Ctx, write: bool) -> SmallVec<[Key; INLINE]> {
        self.0.iter().map(|&n| Key::open(ctx, n, write)).collect()
    }
}

/// Refuses a list of key names that names one key twice, answering the
/// repeated name. Linear in the number of names (a hash set past a
/// handful), so a caller-sized list costs what it weighs.
fn distinct<'a>(names: impl ExactSizeIterator<Item = &'a [u8]> + Clone) -> Result<(), &'a [u8]> {
    if names.len() <= 8 {
        for (i, k) in names.clone().enumerate() {
            if names.clone().take(i).any(|other| other == k) {
                return Err(k);
            }
        }
        return Ok(());
    }
    let mut seen = HashSet::with_capacity(names.len());
    for k in names {
        if !seen.insert(k) {
            return Err(k);
        }
    }
    Ok(())
}

/// Open keys and the values of type `T` they hold (None: no key).
pub(crate) struct Loaded<T> {
    keys: SmallVec<[Key; INLINE]>,
    values: SmallVec<[Option<NonNull<T>>; INLINE]>,
}

/// Opens `keys` and reads each as a `T`; WRONGTYPE, before anything is
/// written, if one holds something else.
pub(crate) fn load<T: Value>(ctx: Ctx, keys: DistinctKeys, write: bool) -> Result<Loaded<T>, String> {
    let ty = handle::<T>();
    let keys = keys.open(ctx, write);
    let mut values = SmallVec::new();
    for key in &keys {
        values.push(match key.held::<T>(ty) {
            Held::Nothing => None,
            Held::Ours(v) => Some(v),
            Held::Other => return Err(wrongtype()),
        });
    }
    Ok(Loaded { keys, values })
}

impl<T: Value> Loaded<T> {
    pub fn get(&self, i: usize) -> Option<&T> {
        // SAFETY: the value belongs to the open key and lives while it does.
        self.values[i].map(|v| unsafe { v.as_ref() })
    }

    /// The value of key `i` to change, created by `new` if the key has none.
    pub fn get_or_create(&mut self, i: usize, new: impl FnOnce() -> T) -> Result<&mut T, String> {
        self.keys[i].mark_written();
        let v = match self.values[i] {
            Some(v) => v,
            None => {
                let ty = handle::<T>();
                if !self.keys[i].set_value(ty, Box::new(new())) {
                    return Err("ERR could not create the key".into());
                }
                let Held::Ours(v) = self.keys[i].held::<T>(ty) else {
                    return Err("ERR could not read back the new key".into());
                };
                self.values[i] = Some(v);
                v
            }
        };
        // SAFETY: as in `get`; the keys are distinct (`DistinctKeys`), so
        // the command holds the only reference.
        Ok(unsafe { &mut *v.as_ptr() })
    }

    /// Writes `value` to key `i` (in place when it exists) and its expiry.
    pub fn store(&mut self, i: usize, value: T, expires_at_ms: u64) -> Result<(), String> {
        match self.values[i] {
            Some(v) => {
                self.keys[i].mark_written();
                // SAFETY: as in `get_or_create`.
                unsafe { *v.as_ptr() = value }
            }
            None => {
                self.get_or_create(i, || value)?;
            }
        }
        self.expire_at(i, expires_at_ms);
        Ok(())
    }

    /// Sets key `i`'s expiry; u64::MAX: none.
    pub fn expire_at(&self, i: usize, expires_at_ms: u64) {
        self.keys[i].set_expire_at(i64::try_from(expires_at_ms).unwrap_or(-1));
    }

    pub fn remove(&mut self, i: usize) {
        self.keys[i].delete();
        self.values[i] = None;
    }

    /// Key `i`'s expiry, if it exists and has one (ms since the epoch).
    pub fn expires_at(&self, i: usize) -> Option<u64> {
        self.values[i].and_then(|_| self.keys[i].expire_at()).map(|at| at as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::named_twice;

    /// Stand-ins for module strings: pointers that are indexes into `NAMES`
    /// (never dereferenced).
    const NAMES: [&[u8]; 10] = [b"a", b"b", b"c", b"d", b"e", b"f", b"g", b"h", b"i", b"a"];

    fn keys(of: &[usize]) -> Vec<*mut RedisModuleString> {
        of.iter().map(|&i| i as *mut RedisModuleString).collect()
    }

    /// How many keys `DistinctKeys` took, or the name it refused.
    fn checked(names: &[*mut RedisModuleString]) -> Result<usize, Vec<u8>> {
        DistinctKeys::checked(names, |n| NAMES[n as usize]).map(|k| k.names().len()).map_err(<[u8]>::to_vec)
    }

    #[test]
    fn only_distinct_keys_can_be_loaded() {
        assert_eq!(checked(&keys(&[0])), Ok(1));
        assert_eq!(checked(&keys(&[0, 1, 2])), Ok(3));
        assert_eq!(checked(&keys(&[0, 1, 0])), Err(b"a".to_vec()));
        // Past the linear check's handful, the hash set.
        assert_eq!(checked(&keys(&[0, 1, 2, 3, 4, 5, 6, 7, 8])), Ok(9));
        assert_eq!(checked(&keys(&[0, 1, 2, 3, 4, 5, 6, 7, 8, 9])), Err(b"a".to_vec()));
        assert_eq!(named_twice(&checked(&keys(&[1, 1])).unwrap_err()), "ERR key 'b' is named more than once");
    }
}
