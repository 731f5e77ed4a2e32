// Package identity names identity groups: endpoints whose cached blocks
// are comparable because they share model, block size, key format,
// summary parameters and tokenizer (DESIGN.md §4). Endpoints of different
// groups are never compared. Pure: no I/O.
package identity
