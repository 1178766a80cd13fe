"""The host as root touches it: safe files and dirs, locks, bounded commands, users,
process identity and the state kept between runs."""
