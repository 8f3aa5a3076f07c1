package api

// MaxBatchBytes is maxBatchBytes, for the tests of package api_test.
const MaxBatchBytes = maxBatchBytes
