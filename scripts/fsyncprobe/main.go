// Command fsyncprobe measures how long fdatasync of a small append takes on
// a directory's file system, the way a write-ahead log syncs, alone or
// while a background writer writes files in bursts the way a memtable
// flush or a compaction does. It prints the distribution of the syncs, so
// that the latency tails of a benchmark can be told apart from the disk's.
//
//	go run ./scripts/fsyncprobe -dir /tmp/probe -burst 0       # the log alone
//	go run ./scripts/fsyncprobe -dir /tmp/probe -burst 48      # 48 MiB bursts, synced at their end
//	go run ./scripts/fsyncprobe -dir /tmp/probe -burst 48 -sync-every 1  # synced every MiB
package main

import (
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"slices"
	"time"
)

func main() {
	dir := flag.String("dir", os.TempDir(), "directory to write in (its files are removed at the end)")
	duration := flag.Duration("duration", 12*time.Second, "how long to measure")
	record := flag.Int("record", 8192, "bytes appended to the log before each sync")
	pause := flag.Duration("pause", 500*time.Microsecond, "pause between the log's syncs")
	burst := flag.Int("burst", 0, "MiB the background writer writes per file (0: no background writer)")
	every := flag.Int("sync-every", 0, "the background writer syncs every this many MiB (0: once per file)")
	gap := flag.Duration("gap", 300*time.Millisecond, "pause between the background writer's files")
	flag.Parse()
	if err := os.MkdirAll(*dir, 0o755); err != nil {
		log.Fatal(err)
	}
	wal, err := os.Create(filepath.Join(*dir, "probe-log"))
	if err != nil {
		log.Fatal(err)
	}
	defer os.Remove(wal.Name())
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		if *burst > 0 {
			background(*dir, *burst, *every, *gap, stop)
		}
	}()
	var lat []time.Duration
	buf := make([]byte, *record)
	for end := time.Now().Add(*duration); time.Now().Before(end); {
		if _, err := wal.Write(buf); err != nil {
			log.Fatal(err)
		}
		t := time.Now()
		if err := wal.Sync(); err != nil {
			log.Fatal(err)
		}
		lat = append(lat, time.Since(t))
		time.Sleep(*pause)
	}
	close(stop)
	<-stopped
	slices.Sort(lat)
	q := func(p float64) time.Duration { return lat[int(float64(len(lat)-1)*p)].Round(time.Microsecond) }
	fmt.Printf("burst %d MiB, sync every %d MiB: %d syncs, p50 %v, p99 %v, p99.9 %v, max %v\n",
		*burst, *every, len(lat), q(0.5), q(0.99), q(0.999), lat[len(lat)-1].Round(time.Microsecond))
}

// background writes files of size MiB one after the other, keeping the
// last two, until stop is closed.
func background(dir string, size, every int, gap time.Duration, stop chan struct{}) {
	buf := make([]byte, 1<<20)
	name := func(i int) string { return filepath.Join(dir, fmt.Sprintf("probe-bulk-%d", i)) }
	for i := 0; ; i++ {
		select {
		case <-stop:
			for j := max(0, i-2); j < i; j++ {
				os.Remove(name(j))
			}
			return
		default:
		}
		f, err := os.Create(name(i))
		if err != nil {
			log.Fatal(err)
		}
		for j := 1; j <= size; j++ {
			if _, err := f.Write(buf); err != nil {
				log.Fatal(err)
			}
			if every > 0 && j%every == 0 {
				f.Sync()
			}
		}
		f.Sync()
		f.Close()
		if i >= 2 {
			os.Remove(name(i - 2))
		}
		time.Sleep(gap)
	}
}
