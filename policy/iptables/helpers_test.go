package iptables_test

import (
	"math/rand/v2"
	"strconv"
)

func newRand() *rand.Rand { return rand.New(rand.NewPCG(7, 11)) }

func itoa(i int) string { return strconv.Itoa(i) }
