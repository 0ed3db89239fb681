//! Tenants: who a connection is (a claimed name checked against the peer's uid),
//! what the server's tenant table allows it (quota, weight, class, devices), and
//! each tenant's memory account, shared by all of its sessions.
//!
//! Authentication. A connection's tenant is the name it claims (`cumux run
//! --tenant NAME`, sent in `Hello.tenant`); with no name, it is the configured
//! tenant whose `uids` list the peer's uid (unix sockets, `SO_PEERCRED`), else
//! `default`. A configured tenant with a `uids` list can only be claimed by a
//! connection whose peer uid is in that list; over TCP the peer has no uid, so
//! such a tenant cannot be claimed there at all. A tenant without `uids` is open
//! to anyone: list `uids` for every tenant whose quota matters. On a server
//! whose table lists tenants, every unlisted name (and `default`) is the one
//! tenant `anonymous`, with the `[defaults]` settings, so made-up names share
//! one quota and one weight; set `allow_unknown = false` to turn them away. A
//! server with no table lets every name stand for itself.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::Deserialize;

use crate::admission::SessionLimits;
use crate::locking::lock;

/// The tenant name of a connection that claims none and matches no `uids`.
pub const DEFAULT_TENANT: &str = "default";
/// The one tenant every name the table does not list becomes, on a server
/// whose table lists tenants: made-up names share its quota and its weight,
/// so they cannot inflate anyone's share.
pub const ANONYMOUS_TENANT: &str = "anonymous";
/// Longest tenant name accepted (bytes).
pub const MAX_TENANT_NAME: usize = 64;
/// Shortest token a config may give (bytes): a guessable token is no proof.
pub const MIN_TOKEN_BYTES: usize = 16;

/// Whether `given` is `secret`, in time that does not depend on where they
/// differ.
fn same_secret(given: &str, secret: &str) -> bool {
    use subtle::ConstantTimeEq;
    given.len() == secret.len() && bool::from(given.as_bytes().ct_eq(secret.as_bytes()))
}

/// How the scheduler treats a tenant's work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TenantClass {
    LatencyCritical,
    #[default]
    Batch,
}

/// What one tenant is allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantSettings {
    /// Device memory the tenant may hold across all its sessions (bytes);
    /// `None`: as much as the device has.
    pub memory_quota: Option<u64>,
    /// Relative share of device time under the fair policy (at least 1).
    pub weight: u32,
    pub class: TenantClass,
    /// Server device ordinals the tenant may see; `None`: all of them.
    pub devices: Option<Vec<u32>>,
    /// Peer uids allowed to act as this tenant; `None`: anyone.
    pub uids: Option<Vec<u32>>,
    /// The secret that proves a client is this tenant (`CUMUX_TOKEN`), the
    /// only proof over TCP. A tenant with one cannot be claimed without it
    /// (unless its `uids` list the peer).
    pub token: Option<String>,
    /// In `shared` mode, whether the tenant's kernels run unfenced (and its
    /// cubin-only modules load): it may then reach other tenants' memory.
    pub trusted: bool,
    /// The share of a GPU's SMs the tenant's kernels may use (1 to 99 %;
    /// `None`: all), at the place [`crate::sm_parts`] gives it: each session
    /// runs in a green context of those SMs (`isolated`), or makes its
    /// streams in one (`shared`, `fenced`).
    pub sm_percent: Option<u8>,
}

impl Default for TenantSettings {
    fn default() -> Self {
        TenantSettings {
            memory_quota: None,
            weight: 1,
            class: TenantClass::Batch,
            devices: None,
            uids: None,
            token: None,
            trusted: false,
            sm_percent: None,
        }
    }
}

impl TenantSettings {
    pub fn allows_device(&self, ordinal: u32) -> bool {
        self.devices.as_ref().is_none_or(|d| d.contains(&ordinal))
    }
}

/// The server's tenant table. The default lets everyone in, with everything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantPolicy {
    /// Whether a name the table does not list is let in (with `defaults`).
    pub allow_unknown: bool,
    /// Settings of tenants the table does not list.
    pub defaults: TenantSettings,
    pub tenants: BTreeMap<String, TenantSettings>,
    /// How many sessions the server holds, in all and per holder.
    pub limits: SessionLimits,
    /// The token that lets a `cumux status` see every tenant's sessions.
    pub admin_token: Option<String>,
}

impl Default for TenantPolicy {
    fn default() -> Self {
        TenantPolicy {
            allow_unknown: true,
            defaults: TenantSettings::default(),
            tenants: BTreeMap::new(),
            limits: SessionLimits::default(),
            admin_token: None,
        }
    }
}

impl TenantPolicy {
    /// Checks values a config file could get wrong.
    pub fn validate(&self) -> Result<(), String> {
        self.limits.validate()?;
        if self.tenants.contains_key(ANONYMOUS_TENANT) {
            return Err(format!(
                "tenant {ANONYMOUS_TENANT:?} is the name unlisted tenants share: set its quota and weight in [defaults]"
            ));
        }
        for (name, s) in std::iter::once(("defaults", &self.defaults))
            .chain(self.tenants.iter().map(|(n, s)| (n.as_str(), s)))
        {
            if s.weight == 0 {
                return Err(format!("tenant {name:?}: weight must be at least 1"));
            }
            if s.sm_percent.is_some_and(|p| p == 0 || p >= 100) {
                return Err(format!(
                    "tenant {name:?}: sm_percent caps the SMs at 1 to 99 % (none: all)"
                ));
            }
            if name.is_empty() || name.len() > MAX_TENANT_NAME {
                return Err(format!(
                    "tenant name {name:?} must have 1 to {MAX_TENANT_NAME} bytes"
                ));
            }
        }
        if self.defaults.token.is_some() {
            return Err("[defaults] cannot have a token: a token names one tenant".into());
        }
        let tokens = self
            .tenants
            .iter()
            .filter_map(|(name, s)| s.token.as_deref().map(|t| (name.as_str(), t)))
            .chain(self.admin_token.as_deref().map(|t| ("admin_token", t)));
        let mut seen: Vec<&str> = Vec::new();
        for (name, token) in tokens {
            if token.len() < MIN_TOKEN_BYTES || token.len() > cumux_protocol::MAX_TOKEN_BYTES {
                return Err(format!(
                    "{name}: a token must have {MIN_TOKEN_BYTES} to {} bytes",
                    cumux_protocol::MAX_TOKEN_BYTES
                ));
            }
            if seen.contains(&token) {
                return Err(format!("{name}: its token is another's too"));
            }
            seen.push(token);
        }
        Ok(())
    }

    /// Whether `token` is the admin token (`cumux status` then shows all).
    pub fn is_admin_token(&self, token: Option<&str>) -> bool {
        matches!((token, &self.admin_token), (Some(t), Some(admin)) if same_secret(t, admin))
    }

    /// Decides who a connection is: its tenant name and settings, or why it
    /// is turned away. `peer_uid` is `None` where the transport has no uid
    /// (TCP): there only a `token` names a configured tenant.
    pub fn admit(
        &self,
        claimed: Option<&str>,
        peer_uid: Option<u32>,
        token: Option<&str>,
    ) -> Result<(String, TenantSettings), String> {
        if let Some(token) = token {
            return self.admit_by_token(claimed, token);
        }
        let (name, settings) = self.admit_unproven(claimed, peer_uid)?;
        if let Some(uids) = &settings.uids {
            match peer_uid {
                Some(uid) if uids.contains(&uid) => return Ok((name, settings)),
                Some(uid) => {
                    return Err(format!(
                        "tenant {name:?} is not open to uid {uid}: the config lets only uids {uids:?} act as it"
                    ))
                }
                None => {
                    return Err(format!(
                        "tenant {name:?} is bound to uids {uids:?}, which a TCP connection cannot prove; connect over the unix socket or give its token (CUMUX_TOKEN)"
                    ))
                }
            }
        }
        if settings.token.is_some() {
            return Err(format!("tenant {name:?} needs its token: set CUMUX_TOKEN"));
        }
        // Over TCP a name proves nothing: where the table lists tenants, a
        // client without a token is the anonymous tenant.
        let listed = self.tenants.contains_key(&name);
        if peer_uid.is_none() && listed {
            return match self.allow_unknown {
                true => Ok((ANONYMOUS_TENANT.to_string(), self.defaults.clone())),
                false => Err(format!(
                    "tenant {name:?} over TCP needs its token (CUMUX_TOKEN): a name proves nothing there"
                )),
            };
        }
        Ok((name, settings))
    }

    /// The tenant whose token is `token`.
    fn admit_by_token(
        &self,
        claimed: Option<&str>,
        token: &str,
    ) -> Result<(String, TenantSettings), String> {
        let found = self
            .tenants
            .iter()
            .find(|(_, s)| s.token.as_deref().is_some_and(|t| same_secret(token, t)));
        match (found, claimed) {
            (Some((name, _)), Some(claimed)) if claimed != name => {
                Err(format!("the token given is not tenant {claimed:?}'s"))
            }
            (Some((name, settings)), _) => Ok((name.clone(), settings.clone())),
            // The admin token names no tenant (it only widens `cumux status`):
            // its holder is admitted as a client with no proof at all.
            (None, _) if self.is_admin_token(Some(token)) => self.admit(claimed, None, None),
            (None, _) => Err("the token given is not one this server knows".into()),
        }
    }

    /// The tenant a connection names or is, before any proof is asked.
    fn admit_unproven(
        &self,
        claimed: Option<&str>,
        peer_uid: Option<u32>,
    ) -> Result<(String, TenantSettings), String> {
        let name = match claimed {
            Some(name) => {
                if name.is_empty()
                    || name.len() > MAX_TENANT_NAME
                    || name.chars().any(|c| c.is_control())
                {
                    return Err(format!(
                        "tenant name {name:?} is not 1 to {MAX_TENANT_NAME} printable bytes"
                    ));
                }
                name.to_string()
            }
            None => peer_uid
                .and_then(|uid| {
                    self.tenants
                        .iter()
                        .find(|(_, s)| s.uids.as_ref().is_some_and(|uids| uids.contains(&uid)))
                })
                .map_or_else(|| DEFAULT_TENANT.to_string(), |(n, _)| n.clone()),
        };
        let (name, settings) = match self.tenants.get(&name) {
            Some(settings) => (name, settings),
            // With no table every name stands for itself (one team's server).
            None if self.allow_unknown && self.tenants.is_empty() => (name, &self.defaults),
            None if self.allow_unknown => (ANONYMOUS_TENANT.to_string(), &self.defaults),
            None => {
                return Err(format!(
                    "unknown tenant {name:?}: this server admits only the tenants its config lists (allow_unknown = false)"
                ))
            }
        };
        Ok((name, settings.clone()))
    }
}

/// One tenant's counters for the server's whole life (its accounts come
/// and go with its sessions): what `/metrics` shows, never going down.
#[derive(Debug, Default)]
pub struct TenantCounters {
    pub sessions_opened: AtomicU64,
    pub launches: AtomicU64,
    pub gpu_time_ns: AtomicU64,
    /// Allocations refused because they would take the tenant past its quota.
    pub quota_refusals: AtomicU64,
    /// Sessions whose context a fatal device error made unusable.
    pub faults: AtomicU64,
    /// Time launches waited for the scheduling gate to let them go.
    pub gate_wait_ns: AtomicU64,
    /// Time launches waited because their stream had the most it may have
    /// unfinished (the launch window).
    pub window_wait_ns: AtomicU64,
}

/// Tenant names whose counters are kept apart; past them (a server without a
/// tenant table sees whatever names clients give), the rest share one entry.
pub const MAX_COUNTED_TENANTS: usize = 1024;
/// The shared entry's name.
pub const OTHER_TENANTS: &str = "(other tenants)";

/// The key a table of per-tenant figures for the server's life keeps `name`
/// under: its own where the table has it (`known`) or has room (it holds
/// `kept` names), else the shared [`OTHER_TENANTS`].
pub fn counted_key(name: &str, known: bool, kept: usize) -> &str {
    match known || kept < MAX_COUNTED_TENANTS {
        true => name,
        false => OTHER_TENANTS,
    }
}

/// One tenant's live usage, shared by all its sessions.
#[derive(Debug)]
pub struct TenantAccount {
    pub name: String,
    pub settings: TenantSettings,
    /// The memory quota now (`u64::MAX`: none): the table's, which an admin
    /// may change while the tenant has sessions ([`Accounts::set_quota`]).
    quota: AtomicU64,
    mem_used: AtomicU64,
    sessions: AtomicU64,
    launches: AtomicU64,
    gpu_time_ns: AtomicU64,
    counters: Arc<TenantCounters>,
}

impl TenantAccount {
    /// Counts one launch that took `ns` on the device (its measured launch time).
    pub fn record_launch(&self, ns: u64) {
        self.launches.fetch_add(1, Ordering::Relaxed);
        self.gpu_time_ns.fetch_add(ns, Ordering::Relaxed);
        self.counters.launches.fetch_add(1, Ordering::Relaxed);
        self.counters.gpu_time_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Adds `ns` of measured device time (launches counted apart).
    pub fn record_gpu_time(&self, ns: u64) {
        self.gpu_time_ns.fetch_add(ns, Ordering::Relaxed);
        self.counters.gpu_time_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Launches run by the tenant's sessions since its account was opened.
    pub fn launches(&self) -> u64 {
        self.launches.load(Ordering::Relaxed)
    }

    /// Measured launch time of the tenant's sessions since its account was opened.
    pub fn gpu_time_ns(&self) -> u64 {
        self.gpu_time_ns.load(Ordering::Relaxed)
    }

    pub fn mem_used(&self) -> u64 {
        self.mem_used.load(Ordering::Acquire)
    }

    /// The memory quota now; `None`: none.
    pub fn memory_quota(&self) -> Option<u64> {
        Some(self.quota.load(Ordering::Acquire)).filter(|&q| q != u64::MAX)
    }

    /// The tenant's counters for the server's life.
    pub fn counters(&self) -> &Arc<TenantCounters> {
        &self.counters
    }

    pub fn sessions(&self) -> u64 {
        self.sessions.load(Ordering::Acquire)
    }

    /// Holds `bytes` against the quota: false, and nothing held, when they
    /// would take the tenant past it.
    pub fn reserve(&self, bytes: u64) -> bool {
        let quota = self.quota.load(Ordering::Acquire);
        let held = self
            .mem_used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|total| *total <= quota)
            })
            .is_ok();
        if !held {
            self.counters.quota_refusals.fetch_add(1, Ordering::Relaxed);
        }
        held
    }

    /// Gives back bytes held by [`reserve`](Self::reserve).
    pub fn release(&self, bytes: u64) {
        let before = self
            .mem_used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                Some(used.saturating_sub(bytes))
            })
            .unwrap_or(0);
        debug_assert!(
            before >= bytes,
            "tenant {} released more than it held",
            self.name
        );
    }

    /// The memory the tenant sees on a device of `total` bytes with `free`
    /// bytes free: its share min(quota, total), and what is left of it.
    pub fn mem_info(&self, total: u64, free: u64) -> (u64, u64) {
        let share = self.memory_quota().map_or(total, |q| q.min(total));
        (share.saturating_sub(self.mem_used()).min(free), share)
    }
}

/// Accounts of tenants with live sessions, by name. An account lives while a
/// session holds it; a tenant coming back later starts from zero (its old
/// sessions freed everything).
#[derive(Debug, Default)]
pub struct Accounts {
    accounts: Mutex<BTreeMap<String, Arc<TenantAccount>>>,
    /// Every tenant's counters since the server started (see [`TenantCounters`]).
    counters: Mutex<BTreeMap<String, Arc<TenantCounters>>>,
}

/// A session's hold on its tenant's account; dropping it ends the hold.
#[derive(Debug)]
pub struct AccountHold {
    account: Arc<TenantAccount>,
    accounts: Arc<Accounts>,
}

impl AccountHold {
    pub fn account(&self) -> &Arc<TenantAccount> {
        &self.account
    }
}

impl Drop for AccountHold {
    fn drop(&mut self) {
        let mut map = self.accounts.lock();
        if self.account.sessions.fetch_sub(1, Ordering::AcqRel) == 1 && self.account.mem_used() == 0
        {
            map.remove(&self.account.name);
        }
    }
}

impl Accounts {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Arc<TenantAccount>>> {
        lock(&self.accounts)
    }

    /// The account of `name` (made with `settings` if it has none), held by one
    /// more session.
    pub fn join(self: &Arc<Self>, name: &str, settings: &TenantSettings) -> AccountHold {
        let counters = self.counters_of(name);
        counters.sessions_opened.fetch_add(1, Ordering::Relaxed);
        let mut map = self.lock();
        let account = Arc::clone(map.entry(name.to_string()).or_insert_with(|| {
            Arc::new(TenantAccount {
                name: name.to_string(),
                settings: settings.clone(),
                mem_used: AtomicU64::new(0),
                sessions: AtomicU64::new(0),
                launches: AtomicU64::new(0),
                gpu_time_ns: AtomicU64::new(0),
                quota: AtomicU64::new(settings.memory_quota.unwrap_or(u64::MAX)),
                counters,
            })
        }));
        // A session joining a live account brings the table's quota as it is now.
        account
            .quota
            .store(settings.memory_quota.unwrap_or(u64::MAX), Ordering::Release);
        account.sessions.fetch_add(1, Ordering::AcqRel);
        AccountHold {
            account,
            accounts: Arc::clone(self),
        }
    }

    /// Gives a live account of `name` the quota `quota` (an admin changed the
    /// table): allocations past it are refused from now on; memory held stays.
    pub fn set_quota(&self, name: &str, quota: Option<u64>) {
        if let Some(account) = self.lock().get(name) {
            account
                .quota
                .store(quota.unwrap_or(u64::MAX), Ordering::Release);
        }
    }

    /// Every account, by name.
    pub fn all(&self) -> Vec<Arc<TenantAccount>> {
        self.lock().values().cloned().collect()
    }

    /// `name`'s counters, made at its first session (past
    /// [`MAX_COUNTED_TENANTS`] names, the shared [`OTHER_TENANTS`] ones).
    fn counters_of(&self, name: &str) -> Arc<TenantCounters> {
        let mut map = lock(&self.counters);
        if let Some(c) = map.get(name) {
            return Arc::clone(c);
        }
        let key = counted_key(name, false, map.len());
        Arc::clone(map.entry(key.to_string()).or_default())
    }

    /// Every tenant's counters since the server started, by name.
    pub fn counters(&self) -> Vec<(String, Arc<TenantCounters>)> {
        lock(&self.counters)
            .iter()
            .map(|(n, c)| (n.clone(), Arc::clone(c)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// alice (1 MiB, uid 1000) and open (anyone), nobody else.
    fn policy() -> TenantPolicy {
        let alice = TenantSettings {
            uids: Some(vec![1000]),
            memory_quota: Some(1 << 20),
            ..TenantSettings::default()
        };
        TenantPolicy {
            allow_unknown: false,
            tenants: BTreeMap::from([
                ("alice".into(), alice),
                ("open".into(), TenantSettings::default()),
            ]),
            ..TenantPolicy::default()
        }
    }

    #[test]
    fn names_are_checked_against_uids() {
        let p = policy();
        assert_eq!(p.admit(Some("alice"), Some(1000), None).unwrap().0, "alice");
        assert!(p.admit(Some("alice"), Some(1001), None).is_err());
        assert!(p.admit(Some("alice"), None, None).is_err());
        assert_eq!(p.admit(None, Some(1000), None).unwrap().0, "alice");
        assert_eq!(p.admit(Some("open"), Some(5), None).unwrap().0, "open");
        // Over TCP a listed name without its token proves nothing.
        let tcp = p.admit(Some("open"), None, None).unwrap_err();
        assert!(tcp.contains("needs its token"), "{tcp}");
        let unknown = p.admit(Some("mallory"), Some(1000), None).unwrap_err();
        assert!(unknown.contains("allow_unknown = false"), "{unknown}");
        assert!(
            p.admit(None, Some(7), None).is_err(),
            "default is not listed"
        );
        assert!(p.admit(Some(""), None, None).is_err());
        assert!(p.admit(Some("a\nb"), None, None).is_err());
        let open = TenantPolicy::default();
        assert_eq!(open.admit(None, None, None).unwrap().0, DEFAULT_TENANT);
        assert_eq!(open.admit(Some("x"), None, None).unwrap().1.weight, 1);
    }

    #[test]
    fn unlisted_names_share_one_anonymous_tenant_where_a_table_lists_tenants() {
        let mut p = policy();
        p.allow_unknown = true;
        p.defaults.memory_quota = Some(4 << 20);
        for claimed in [Some("mallory"), Some("eve"), None] {
            let (name, settings) = p.admit(claimed, Some(7), None).unwrap();
            assert_eq!(name, ANONYMOUS_TENANT, "{claimed:?}");
            assert_eq!(settings.memory_quota, Some(4 << 20));
        }
        assert_eq!(p.admit(Some("open"), Some(5), None).unwrap().0, "open");
        assert_eq!(
            p.admit(Some("open"), None, None).unwrap().0,
            ANONYMOUS_TENANT,
            "over TCP, without a token"
        );
        // No table: one team's server, where names stand for themselves.
        let open = TenantPolicy::default();
        assert_eq!(open.admit(Some("eve"), None, None).unwrap().0, "eve");
        // The shared name cannot be configured as a tenant of its own.
        p.tenants
            .insert(ANONYMOUS_TENANT.into(), TenantSettings::default());
        assert!(p.validate().unwrap_err().contains("[defaults]"));
    }

    #[test]
    fn a_token_names_its_tenant_and_nothing_else_does_over_tcp() {
        let mut p = policy();
        let secret = "s3cret-token-of-bob";
        p.tenants.insert(
            "bob".into(),
            TenantSettings {
                token: Some(secret.into()),
                ..TenantSettings::default()
            },
        );
        p.admin_token = Some("the-admin-token-0001".into());
        p.validate().unwrap();
        assert_eq!(p.admit(None, None, Some(secret)).unwrap().0, "bob");
        assert_eq!(p.admit(Some("bob"), None, Some(secret)).unwrap().0, "bob");
        let other = p.admit(Some("alice"), None, Some(secret)).unwrap_err();
        assert!(other.contains("not tenant \"alice\"'s"), "{other}");
        let wrong = p
            .admit(Some("bob"), None, Some("s3cret-token-of-bo_"))
            .unwrap_err();
        assert_eq!(wrong, "the token given is not one this server knows");
        // Without it, not even on the unix socket.
        let bare = p.admit(Some("bob"), Some(1000), None).unwrap_err();
        assert!(bare.contains("needs its token"), "{bare}");
        // The admin token widens status only; it is no tenant's.
        assert!(p.is_admin_token(Some("the-admin-token-0001")));
        assert!(!p.is_admin_token(Some(secret)) && !p.is_admin_token(None));
        assert!(p
            .admit(Some("bob"), None, Some("the-admin-token-0001"))
            .is_err());
        // Weak or shared tokens are config errors.
        p.admin_token = Some("short".into());
        assert!(p.validate().unwrap_err().contains("16 to 256 bytes"));
        p.admin_token = Some(secret.into());
        assert!(p.validate().unwrap_err().contains("another's too"));
    }

    #[test]
    fn quotas_hold_exactly() {
        let accounts = Arc::new(Accounts::default());
        let p = policy();
        let settings = &p.tenants["alice"];
        let a = accounts.join("alice", settings);
        let b = accounts.join("alice", settings);
        assert!(a.account().reserve(1 << 19));
        assert!(b.account().reserve(1 << 19));
        assert!(!a.account().reserve(1), "past the quota");
        assert_eq!(a.account().mem_info(8 << 20, 8 << 20), (0, 1 << 20));
        a.account().release(1 << 19);
        assert_eq!(b.account().mem_info(8 << 20, 100), (100, 1 << 20));
        b.account().release(1 << 19);
        drop(a);
        assert_eq!(accounts.all().len(), 1);
        drop(b);
        assert!(accounts.all().is_empty());
    }
}
