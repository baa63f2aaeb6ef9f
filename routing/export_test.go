package routing

// SetLearning lets the kernel tests turn learning on, as drift to repair.
var SetLearning = setLearning
