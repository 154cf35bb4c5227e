//! Opening a call's keys and reading their values, with the one rule that
//! keeps it safe: a call names each key once. Two handles on one key would
//! let one free the value the other still points to.

use std::collections::HashSet;
use std::ptr::NonNull;

use redis_module::raw::RedisModuleString;
use rl_core::INLINE;
use smallvec::SmallVec;

use super::{handle, Value};
use crate::ffi::{Ctx, Held, Key};

pub(crate) fn wrongtype() -> String {
    "WRONGTYPE Operation against a key holding the wrong kind of value".into()
}

/// Refuses a list of key names that names one key twice, answering the
/// repeated name. Linear in the number of names (a hash set past a
/// handful), so a caller-sized list costs what it weighs.
pub(crate) fn distinct<'a>(names: impl ExactSizeIterator<Item = &'a [u8]> + Clone) -> Result<(), &'a [u8]> {
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

/// Opens `names` (distinct: see [`distinct`]) and reads each as a `T`;
/// WRONGTYPE, before anything is written, if one holds something else.
pub(crate) fn load<T: Value>(ctx: Ctx, names: &[*mut RedisModuleString], write: bool) -> Result<Loaded<T>, String> {
    let ty = handle::<T>();
    let keys: SmallVec<[Key; INLINE]> = names.iter().map(|&n| Key::open(ctx, n, write)).collect();
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
        // SAFETY: as in `get`; the keys are distinct, so the command holds
        // the only reference.
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
