fn main() {
    let _ = limitador::RateLimiter::new(100);
}
