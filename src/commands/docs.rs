//! What `COMMAND INFO` and `COMMAND DOCS` say about each command: a summary
//! and key specs, so cluster-aware clients find the keys without asking
//! (Redis itself routes numkeys commands through `getkeys-api`).

use std::ffi::{c_int, CStr};
use std::mem::size_of;

use redis_module::raw::{
    self, RedisModuleCommand, RedisModuleCommandArg, RedisModuleCommandHistoryEntry, RedisModuleCommandInfo,
    RedisModuleCommandInfoVersion, RedisModuleCommandKeySpec, RedisModuleCommandKeySpec__bindgen_ty_1,
    RedisModuleCommandKeySpec__bindgen_ty_1__bindgen_ty_1, RedisModuleCommandKeySpec__bindgen_ty_2,
    RedisModuleCommandKeySpec__bindgen_ty_2__bindgen_ty_1, RedisModuleCommandKeySpec__bindgen_ty_2__bindgen_ty_2,
};

/// Where a command's keys are.
#[derive(Clone, Copy)]
pub enum Keys {
    /// `CMD numkeys key [key ...]`.
    Numkeys,
    /// argv[1] only.
    One,
    /// From argv[1] to the end, every `step`th.
    Every(c_int),
}

/// How a command uses its keys.
#[derive(Clone, Copy)]
pub enum Access {
    /// Reads, then writes what it read (the limiter commands).
    Update,
    /// Reads only.
    Read,
    /// Replaces the value whatever it was (the internal RL.SET).
    Overwrite,
}

pub struct Doc {
    pub summary: &'static CStr,
    pub since: &'static CStr,
    pub complexity: &'static CStr,
    pub keys: Keys,
    pub access: Access,
}

/// Sets a command's info. Best effort: a server that rejects it still runs
/// the command (its keys are declared through getkeys-api or the legacy
/// positions anyway), so a failure is only logged by the caller.
pub fn set(command: *mut RedisModuleCommand, doc: &Doc) -> bool {
    let Some(set_info) = (unsafe { raw::RedisModule_SetCommandInfo }) else { return false };
    let flags = match doc.access {
        Access::Update => {
            raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_ACCESS | raw::REDISMODULE_CMD_KEY_UPDATE
        }
        Access::Read => raw::REDISMODULE_CMD_KEY_RO | raw::REDISMODULE_CMD_KEY_ACCESS,
        Access::Overwrite => raw::REDISMODULE_CMD_KEY_OW | raw::REDISMODULE_CMD_KEY_UPDATE,
    } as u64;
    let find_keys = match doc.keys {
        Keys::Numkeys => (
            raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_KEYNUM,
            RedisModuleCommandKeySpec__bindgen_ty_2 {
                keynum: RedisModuleCommandKeySpec__bindgen_ty_2__bindgen_ty_2 { keynumidx: 0, firstkey: 1, keystep: 1 },
            },
        ),
        Keys::One | Keys::Every(_) => {
            let (lastkey, keystep) = match doc.keys {
                Keys::Every(step) => (-1, step),
                _ => (0, 1),
            };
            (
                raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_RANGE,
                RedisModuleCommandKeySpec__bindgen_ty_2 {
                    range: RedisModuleCommandKeySpec__bindgen_ty_2__bindgen_ty_1 { lastkey, keystep, limit: 0 },
                },
            )
        }
    };
    // Key specs end with a zeroed entry; the server copies what it keeps.
    let mut specs = [
        RedisModuleCommandKeySpec {
            notes: std::ptr::null(),
            flags,
            begin_search_type: raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INDEX,
            bs: RedisModuleCommandKeySpec__bindgen_ty_1 {
                index: RedisModuleCommandKeySpec__bindgen_ty_1__bindgen_ty_1 { pos: 1 },
            },
            find_keys_type: find_keys.0,
            fk: find_keys.1,
        },
        // SAFETY: an all-zero key spec is the terminator the API expects.
        unsafe { std::mem::zeroed() },
    ];
    let version = RedisModuleCommandInfoVersion {
        version: 1,
        sizeof_historyentry: size_of::<RedisModuleCommandHistoryEntry>(),
        sizeof_keyspec: size_of::<RedisModuleCommandKeySpec>(),
        sizeof_arg: size_of::<RedisModuleCommandArg>(),
    };
    let info = RedisModuleCommandInfo {
        version: &version,
        summary: doc.summary.as_ptr(),
        complexity: doc.complexity.as_ptr(),
        since: doc.since.as_ptr(),
        history: std::ptr::null_mut(),
        tips: std::ptr::null(),
        // 0: no arity check by the server, so the module's own messages
        // (which name the argument at fault) answer short calls.
        arity: 0,
        key_specs: specs.as_mut_ptr(),
        args: std::ptr::null_mut(),
    };
    unsafe { set_info(command, &info) == raw::REDISMODULE_OK as c_int }
}
