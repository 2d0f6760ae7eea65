//! `future-contract`: built against a newer `herald:plugin` contract than the host's.
wit_bindgen::generate!({
    inline: r#"
        package herald:plugin@0.3.0;
        interface message-policy {
            check: func(body: list<u8>) -> bool;
        }
        world next-contract {
            export message-policy;
        }
    "#,
});

struct Future;

impl exports::herald::plugin::message_policy::Guest for Future {
    fn check(_body: Vec<u8>) -> bool {
        true
    }
}

export!(Future);
