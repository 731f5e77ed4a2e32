// Package vectors serves the vLLM test vectors to tests: block hashes
// captured from a real vLLM (llm-d's kv_event_base / kv_event_lora
// captures), digests derived independently from vLLM's algorithm, and msgpack
// event batches in both wire layouts. The files in testdata/ are byte-for-byte
// copies of the shared vllm-vectors folder (see testdata/README.md for their
// provenance); a test checks that they still match it.
package vectors
