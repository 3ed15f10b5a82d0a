// Test fixture: what Go's runtime and standard library do inside a policy
// instance (the WASI preview 1 adapter under them, the garbage collector,
// goroutines). Requests under /go/ each try one thing; the others follow
// the built-in rules.
//
//	/go/panic       panics: the request fails alone, the message is logged
//	/go/print       fmt.Println: a log line at info; answers "printed"
//	/go/time        time.Now and a 2 s time.Sleep: answers "now=<ms>
//	                slept=<ns>" (the sleep passes in virtual time)
//	/go/alloc       8 MiB of garbage per request: the collector keeps a
//	                reused instance under the memory cap
//	/go/goroutines  sums 1..100 in 10 goroutines over a channel
package main

import (
	"fmt"
	"strconv"
	"sync"
	"time"

	"example.invalid/inlay/guest-sdk/go/policy"
)

// keep holds the last allocation, so that the compiler cannot drop it.
var keep []byte

func text(body string) policy.Action {
	return policy.Synthetic(200, []byte(body), policy.Header{Name: "content-type", Value: "text/plain"})
}

type runtimeFixture struct{}

func (runtimeFixture) OnRequest(req *policy.Request) policy.Action {
	switch req.Path() {
	case "/go/panic":
		panic("go fixture: refusing " + req.URL())
	case "/go/print":
		fmt.Println("go fixture says hello to", req.URL())
		return text("printed")
	case "/go/time":
		now := time.Now()
		time.Sleep(2 * time.Second)
		return text("now=" + strconv.FormatInt(now.UnixMilli(), 10) +
			" slept=" + strconv.FormatInt(int64(time.Since(now)), 10))
	case "/go/alloc":
		for i := 0; i < 8; i++ {
			keep = make([]byte, 1<<20)
			keep[len(keep)-1] = byte(i)
		}
		return text("allocated")
	case "/go/goroutines":
		sums := make(chan int)
		var wg sync.WaitGroup
		for g := 0; g < 10; g++ {
			wg.Add(1)
			go func(from int) {
				defer wg.Done()
				s := 0
				for n := from; n < from+10; n++ {
					s += n
				}
				sums <- s
			}(g*10 + 1)
		}
		go func() { wg.Wait(); close(sums) }()
		total := 0
		for s := range sums {
			total += s
		}
		return text(strconv.Itoa(total))
	}
	return policy.BuiltinRecv(req)
}

func init() { policy.Export(runtimeFixture{}) }

func main() {}
