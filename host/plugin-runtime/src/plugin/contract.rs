//! The contract versions a plugin may be built for, and a component's exports under each:
//! what [`inspect`] checks at load time, the export handles found once per loaded version
//! ([`Indices`]) and once per instance ([`Guests`]), and a call of whichever version it is.

use crate::{
    CONTRACT_VERSION,
    call::{Input, Output},
    config::Hook,
    engine::Runtime,
    error::PluginError,
    state::StoreState,
};
use herald_plugin_bindings::exports::herald::plugin::{
    announce_policy, connect, degrade, deliver_filter, message_policy, route_key,
};
use herald_plugin_bindings::v0_1;
use wasmtime::{
    Store,
    component::{Component, InstancePre},
};

/// A contract version this host serves. Later versions only add to earlier ones, so every
/// version's hooks take and return the same data types; what differs is the names a
/// component's imports and exports carry (`herald:plugin/<interface>@<version>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Contract {
    V0_1,
    V0_2,
}

impl Contract {
    /// Every version served, oldest first.
    const ALL: [Contract; 2] = [Contract::V0_1, Contract::V0_2];

    pub fn version(self) -> &'static str {
        match self {
            Contract::V0_1 => v0_1::CONTRACT_VERSION,
            Contract::V0_2 => CONTRACT_VERSION,
        }
    }

    fn parse(version: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.version() == version)
    }

    /// Whether this version defines `hook`.
    fn defines(self, hook: Hook) -> bool {
        hook != Hook::DeliverFilter || self != Contract::V0_1
    }
}

/// A hook's export handles under each contract version that defines it: `$indices` (found
/// once per loaded version) and `$guest` (looked up once per instance).
macro_rules! versioned_hook {
    ($indices:ident, $guest:ident, $module:ident) => {
        enum $indices {
            V0_1(v0_1::exports::herald::plugin::$module::GuestIndices),
            V0_2($module::GuestIndices),
        }

        enum $guest {
            V0_1(v0_1::exports::herald::plugin::$module::Guest),
            V0_2($module::Guest),
        }

        impl $indices {
            fn new(pre: &InstancePre<StoreState>, contract: Contract) -> wasmtime::Result<Self> {
                Ok(match contract {
                    Contract::V0_1 => Self::V0_1(v0_1::exports::herald::plugin::$module::GuestIndices::new(pre)?),
                    Contract::V0_2 => Self::V0_2($module::GuestIndices::new(pre)?),
                })
            }

            fn load(
                &self,
                store: &mut Store<StoreState>,
                instance: &wasmtime::component::Instance,
            ) -> wasmtime::Result<$guest> {
                Ok(match self {
                    Self::V0_1(i) => $guest::V0_1(i.load(store, instance)?),
                    Self::V0_2(i) => $guest::V0_2(i.load(store, instance)?),
                })
            }
        }
    };
}

versioned_hook!(MessagePolicyIndices, MessagePolicyGuest, message_policy);
versioned_hook!(AnnouncePolicyIndices, AnnouncePolicyGuest, announce_policy);
versioned_hook!(RouteKeyIndices, RouteKeyGuest, route_key);
versioned_hook!(DegradeIndices, DegradeGuest, degrade);
versioned_hook!(ConnectIndices, ConnectGuest, connect);

/// Calls `$method` on a versioned guest, whichever version it is.
macro_rules! call_versioned {
    ($kind:ident, $guest:expr, $method:ident, $store:expr, $arg:expr) => {
        match $guest {
            Some(g) => match g {
                $kind::V0_1(g) => g.$method($store, $arg).await,
                $kind::V0_2(g) => g.$method($store, $arg).await,
            },
            None => Err(wasmtime::format_err!("the plugin does not export this hook")),
        }
    };
}

/// A loaded version's export handles of every hook it exports.
#[derive(Default)]
pub(super) struct Indices {
    message_policy: Option<MessagePolicyIndices>,
    announce_policy: Option<AnnouncePolicyIndices>,
    route_key: Option<RouteKeyIndices>,
    degrade: Option<DegradeIndices>,
    connect: Option<ConnectIndices>,
    // Only contract 0.2.0 on defines it: no older variant.
    deliver_filter: Option<deliver_filter::GuestIndices>,
}

/// An instance's export handles of every hook it exports.
pub(super) struct Guests {
    message_policy: Option<MessagePolicyGuest>,
    announce_policy: Option<AnnouncePolicyGuest>,
    route_key: Option<RouteKeyGuest>,
    degrade: Option<DegradeGuest>,
    connect: Option<ConnectGuest>,
    deliver_filter: Option<deliver_filter::Guest>,
}

impl Indices {
    /// Finds the export handles of `hooks` (the ones [`inspect`] found) in `pre`.
    pub fn of(pre: &InstancePre<StoreState>, contract: Contract, hooks: &[Hook]) -> wasmtime::Result<Self> {
        let mut indices = Indices::default();
        for hook in hooks {
            match hook {
                Hook::MessagePolicy => indices.message_policy = Some(MessagePolicyIndices::new(pre, contract)?),
                Hook::AnnouncePolicy => indices.announce_policy = Some(AnnouncePolicyIndices::new(pre, contract)?),
                Hook::RouteKey => indices.route_key = Some(RouteKeyIndices::new(pre, contract)?),
                Hook::Degrade => indices.degrade = Some(DegradeIndices::new(pre, contract)?),
                Hook::Connect => indices.connect = Some(ConnectIndices::new(pre, contract)?),
                // `inspect` finds it only in a 0.2.0 component or later.
                Hook::DeliverFilter => indices.deliver_filter = Some(deliver_filter::GuestIndices::new(pre)?),
            }
        }
        Ok(indices)
    }

    /// Looks the handles up in a fresh instance.
    pub fn load(
        &self,
        store: &mut Store<StoreState>,
        instance: &wasmtime::component::Instance,
    ) -> wasmtime::Result<Guests> {
        Ok(Guests {
            message_policy: self.message_policy.as_ref().map(|x| x.load(&mut *store, instance)).transpose()?,
            announce_policy: self.announce_policy.as_ref().map(|x| x.load(&mut *store, instance)).transpose()?,
            route_key: self.route_key.as_ref().map(|x| x.load(&mut *store, instance)).transpose()?,
            degrade: self.degrade.as_ref().map(|x| x.load(&mut *store, instance)).transpose()?,
            connect: self.connect.as_ref().map(|x| x.load(&mut *store, instance)).transpose()?,
            deliver_filter: self.deliver_filter.as_ref().map(|x| x.load(&mut *store, instance)).transpose()?,
        })
    }
}

impl Guests {
    /// Calls the hook `input` is for.
    pub async fn call(&self, store: &mut Store<StoreState>, input: Input<'_>) -> wasmtime::Result<Output> {
        match input {
            Input::Message(m) => call_versioned!(MessagePolicyGuest, &self.message_policy, call_check, &mut *store, m)
                .map(Output::Message),
            Input::Announcement(a) => {
                call_versioned!(AnnouncePolicyGuest, &self.announce_policy, call_check, &mut *store, a)
                    .map(Output::Announcement)
            }
            Input::Route(r) => {
                call_versioned!(RouteKeyGuest, &self.route_key, call_route_key, &mut *store, r).map(Output::Route)
            }
            Input::Health(h) => {
                call_versioned!(DegradeGuest, &self.degrade, call_choose_tier, &mut *store, *h).map(Output::Tier)
            }
            Input::Connect(c) => {
                call_versioned!(ConnectGuest, &self.connect, call_authorize, &mut *store, c).map(Output::Connect)
            }
            Input::Delivery(d) => match &self.deliver_filter {
                Some(g) => g.call_filter(&mut *store, d).await.map(Output::Dropped),
                None => Err(wasmtime::format_err!("the plugin does not export this hook")),
            },
        }
    }
}

/// Splits `herald:plugin/<interface>@<version>`.
fn contract_name(name: &str) -> Option<(&str, &str)> {
    name.strip_prefix("herald:plugin/")?.split_once('@')
}

/// What [`inspect`] found in a component.
pub(super) struct Inspected {
    pub hooks: Vec<Hook>,
    pub imports: Vec<String>,
    pub contract: Contract,
}

/// Checks imports and exports against the contract: every `herald:plugin` name must carry
/// one version, and one this host serves. Returns the exported hooks, the imports and the
/// version.
pub(super) fn inspect(name: &str, component: &Component, runtime: &Runtime) -> Result<Inspected, PluginError> {
    let ty = component.component_type();
    let engine = &runtime.engine;
    let refuse_version = |found: &str| PluginError::UnsupportedContract {
        name: name.to_owned(),
        found: found.to_owned(),
        supported: CONTRACT_VERSION,
    };
    // The first version named decides; any other version named after it is refused.
    let mut contract = None;
    let mut version_of = |found: &str| -> Result<Contract, PluginError> {
        let this = Contract::parse(found).ok_or_else(|| refuse_version(found))?;
        match contract {
            Some(first) if first != this => Err(PluginError::MixedContracts {
                name: name.to_owned(),
                first: Contract::version(first),
                second: this.version(),
            }),
            _ => {
                contract = Some(this);
                Ok(this)
            }
        }
    };
    let mut imports = Vec::new();
    for (import, _) in ty.imports(engine) {
        if let Some((interface, version)) = contract_name(import) {
            version_of(version)?;
            if interface != "host" && interface != "types" {
                return Err(PluginError::ImportNotProvided { name: name.to_owned(), import: import.to_owned() });
            }
        } else if !import.starts_with("wasi:") {
            return Err(PluginError::ImportNotProvided { name: name.to_owned(), import: import.to_owned() });
        }
        imports.push(import.to_owned());
    }
    let mut hooks = Vec::new();
    for (export, _) in ty.exports(engine) {
        if let Some((interface, version)) = contract_name(export) {
            let this = version_of(version)?;
            if let Some(hook) = Hook::from_wit_name(interface).filter(|&hook| this.defines(hook)) {
                hooks.push(hook);
            }
        }
    }
    hooks.sort();
    if hooks.is_empty() {
        return Err(PluginError::NoHooks { name: name.to_owned() });
    }
    Ok(Inspected { hooks, imports, contract: contract.unwrap_or(Contract::V0_2) })
}
