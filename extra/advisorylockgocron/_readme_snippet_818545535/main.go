package main

import (
	"context"
	"database/sql"
	"log"
	"time"

	"github.com/advisorylock/advisorylock/extra/advisorylockgocron"
	"github.com/go-co-op/gocron/v2"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/robfig/cron/v3"
)

func main() {
	db, err := sql.Open("pgx", "postgres://app@db.internal/app")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	s, err := gocron.NewScheduler()
	if err != nil {
		log.Fatal(err)
	}
	// The digest every 5 minutes, once per tick across the replicas.
	schedule, err := cron.ParseStandard("*/5 * * * *")
	if err != nil {
		log.Fatal(err)
	}
	digest, err := advisorylockgocron.OncePerTick(db, "digest", schedule, func(ctx context.Context, tick time.Time) error {
		log.Print("sending the digest of ", tick)
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := s.NewJob(gocron.CronJob("*/5 * * * *", false), digest); err != nil {
		log.Fatal(err)
	}
	s.Start()
	defer s.Shutdown()
	select {}
}
