// Package testnet gives tests free loopback ports picked at run time, so
// every test binds 127.0.0.1 only and never a fixed port.
package testnet
