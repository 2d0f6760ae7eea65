//! `hostile`: misbehaves on request. The message body picks the failure; anything else is
//! allowed, so tests can show that other calls keep working.
use herald_sdk::{
    MessagePolicy, clock,
    types::{Message, MessageDecision},
};
use std::hint::black_box;

struct Hostile;

impl MessagePolicy for Hostile {
    fn check_message(message: Message) -> MessageDecision {
        match message.body.as_slice() {
            b"loop" => {
                let mut n: u64 = 0;
                loop {
                    n = black_box(n.wrapping_add(1));
                }
            }
            b"grow" => {
                // Far beyond any plugin's memory cap.
                let mut chunks = Vec::new();
                for _ in 0..1024 {
                    chunks.push(black_box(vec![1u8; 1 << 20]));
                }
                MessageDecision::Rewrite(vec![chunks.len() as u8])
            }
            b"panic" => panic!("hostile plugin panics on purpose"),
            b"spin-host" => {
                let mut t = 0;
                loop {
                    t = black_box(t ^ clock::now_ms());
                }
            }
            _ => MessageDecision::Allow,
        }
    }
}

herald_sdk::export_plugin!(Hostile, hooks: [message_policy]);
