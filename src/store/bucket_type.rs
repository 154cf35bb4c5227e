//! `rl-bucket`: a token bucket in a 16-byte native value.
//!
//! Every way the value leaves memory (RDB, AOF rewrite, DUMP/MIGRATE, the
//! digest) goes through the one versioned blob of `rl_core::codec`, the same
//! bytes the replicated `RL.SET` carries.

use std::ffi::{c_int, c_void};

use redis_module::native_types::RedisType;
use redis_module::raw::{self, RedisModuleDigest, RedisModuleIO, RedisModuleString, RedisModuleType};
use rl_core::codec::{self, PackedBucket, Stored};

use crate::ffi::api;

/// RDB encoding version of the type. The blob inside carries its own format
/// version too; this one changes only if the RDB framing itself changes.
pub const ENCODING_VERSION: i32 = 1;

pub static BUCKET_TYPE: RedisType = RedisType::new(
    "rl-bucket",
    ENCODING_VERSION,
    raw::RedisModuleTypeMethods {
        version: raw::REDISMODULE_TYPE_METHOD_VERSION as u64,
        rdb_load: Some(rdb_load),
        rdb_save: Some(rdb_save),
        aof_rewrite: Some(aof_rewrite),
        mem_usage: Some(mem_usage),
        digest: Some(digest),
        free: Some(free),
        aux_load: None,
        aux_save: None,
        aux_save2: None,
        aux_save_triggers: 0,
        free_effort: None,
        unlink: None,
        copy: Some(copy),
        defrag: None,
        copy2: None,
        free_effort2: None,
        mem_usage2: None,
        unlink2: None,
    },
);

/// The type's handle, set when the module loaded.
pub fn bucket_type() -> *mut RedisModuleType {
    *BUCKET_TYPE.raw_type.borrow()
}

/// SAFETY (for all callbacks): the server passes a value this type created,
/// a `Box<PackedBucket>` turned into a raw pointer.
fn packed<'a>(value: *mut c_void) -> &'a PackedBucket {
    unsafe { &*value.cast::<PackedBucket>() }
}

unsafe extern "C" fn rdb_load(rdb: *mut RedisModuleIO, encver: c_int) -> *mut c_void {
    if encver > ENCODING_VERSION {
        return std::ptr::null_mut();
    }
    let Ok(buf) = raw::load_string_buffer(rdb) else {
        return std::ptr::null_mut();
    };
    match codec::decode(buf.as_ref()) {
        Ok(Stored::Bucket(p)) => Box::into_raw(Box::new(p)).cast(),
        _ => std::ptr::null_mut(),
    }
}

unsafe extern "C" fn rdb_save(rdb: *mut RedisModuleIO, value: *mut c_void) {
    raw::save_slice(rdb, &packed(value).to_blob());
}

/// AOF rewrite emits the internal `RL.SET key blob 0`; the server follows it
/// with the key's PEXPIREAT.
unsafe extern "C" fn aof_rewrite(aof: *mut RedisModuleIO, key: *mut RedisModuleString, value: *mut c_void) {
    let blob = packed(value).to_blob();
    api!(RedisModule_EmitAOF)(
        aof,
        c"RL.SET".as_ptr(),
        c"sbl".as_ptr(),
        key,
        blob.as_ptr(),
        blob.len(),
        0i64,
    );
}

unsafe extern "C" fn mem_usage(_value: *const c_void) -> usize {
    std::mem::size_of::<PackedBucket>()
}

unsafe extern "C" fn digest(md: *mut RedisModuleDigest, value: *mut c_void) {
    let mut blob = packed(value).to_blob();
    api!(RedisModule_DigestAddStringBuffer)(md, blob.as_mut_ptr().cast(), blob.len());
    api!(RedisModule_DigestEndSequence)(md);
}

unsafe extern "C" fn free(value: *mut c_void) {
    drop(Box::from_raw(value.cast::<PackedBucket>()));
}

unsafe extern "C" fn copy(
    _from: *mut RedisModuleString,
    _to: *mut RedisModuleString,
    value: *const c_void,
) -> *mut c_void {
    Box::into_raw(Box::new(*packed(value as *mut c_void))).cast()
}
