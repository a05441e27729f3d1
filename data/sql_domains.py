"""Schema vocabularies for the synthetic text-to-SQL task (``scripts/make_data.py``).

One domain = one or two tables. A table is written in a small DSL, one column per ``;``:

    table_name | singular noun | plural noun : column TYPE GEN [| phrase]; ...

TYPE is INTEGER, TEXT, REAL or DATE. GEN says how values are drawn:
``key`` (the table's integer key), ``fk:<table>`` (foreign key to that table's key),
``lo-hi`` (numeric range; DATE: a range of years), ``@pool`` (a shared pool below: person,
first, last, city, country, company, title, word, color, code), or ``[a,b,c]`` (an enum).
Columns whose GEN is an enum, ``@city``, ``@country`` or ``@color`` are categorical (used for
GROUP BY); ``@person``, ``@title``, ``@company``, ``@code``... are names (used for LIKE).
The phrase (default: the column name with ``_`` as spaces) is how questions say the column.
The second table of a domain has a ``fk:`` column to the first.
"""

POOLS = {
    "first": "James Mary Robert Patricia John Jennifer Michael Linda David Elizabeth William Barbara "
             "Richard Susan Joseph Jessica Thomas Sarah Charles Karen Daniel Nancy Matthew Lisa Anthony "
             "Betty Mark Sandra Paul Ashley Steven Emily Andrew Donna Kenneth Michelle Joshua Carol Kevin "
             "Amanda Brian Melissa George Deborah Timothy Laura Ronald Rebecca Jason Sharon Omar Aisha "
             "Hiroshi Yuki Pedro Lucia Ivan Olga Chen Mei Ravi Priya Kwame Amara Lars Ingrid".split(),
    "last": "Smith Johnson Williams Brown Jones Garcia Miller Davis Rodriguez Martinez Hernandez Lopez "
            "Gonzalez Wilson Anderson Thomas Taylor Moore Jackson Martin Lee Perez Thompson White Harris "
            "Sanchez Clark Ramirez Lewis Robinson Walker Young Allen King Wright Scott Torres Nguyen Hill "
            "Flores Green Adams Nelson Baker Hall Rivera Campbell Mitchell Carter Roberts Tanaka Sato "
            "Ivanov Kowalski Muller Rossi Silva Okafor Larsen Dubois Novak Haddad Patel Kim".split(),
    "city": "Paris London Berlin Madrid Rome Vienna Prague Lisbon Dublin Oslo Stockholm Helsinki "
            "Warsaw Athens Budapest Amsterdam Brussels Zurich Geneva Toronto Vancouver Montreal Chicago "
            "Boston Seattle Denver Austin Dallas Miami Atlanta Phoenix Portland Tokyo Osaka Seoul "
            "Beijing Shanghai Mumbai Delhi Cairo Lagos Nairobi Sydney Melbourne Auckland Lima Bogota "
            "Santiago Havana Manila Jakarta Hanoi Istanbul Dubai".split(),
    "country": "France Germany Spain Italy Portugal Ireland Norway Sweden Finland Poland Greece Hungary "
               "Austria Belgium Netherlands Switzerland Canada Mexico Brazil Argentina Chile Peru "
               "Colombia Japan China India Korea Vietnam Thailand Egypt Nigeria Kenya Ghana Morocco "
               "Australia Turkey Israel Denmark Iceland Cuba".split(),
    "color": "red blue green yellow black white silver gray orange purple brown pink".split(),
    "word": "alpha beta gamma delta omega nova orbit echo zenith atlas summit harbor maple cedar "
            "river falcon phoenix comet aurora vertex pioneer horizon ember lotus".split(),
    "adj": "Blue Silent Golden Broken Wild Hidden Lost Bright Dark Little Final Endless Crimson Frozen "
           "Secret Electric Lonely Quiet Burning Silver Midnight Ancient Northern Velvet".split(),
    "noun": "Moon River Road Garden Dream Fire Heart Ocean Sky Storm City Shadow Star Light Forest "
            "Mountain Song Island Mirror Train Winter Summer Kingdom Machine".split(),
    "cosuffix": "Corp Inc Ltd Group Systems Labs Partners Holdings Industries Works".split(),
    "costem": "Acme Globex Initech Umbrella Stark Wayne Hooli Vandelay Soylent Cyberdyne Tyrell "
              "Wonka Oscorp Aperture Massive Gringotts Duff Monarch Nakatomi Prestige Sirius".split(),
}

CATEGORICAL_POOLS = {"city", "country", "color"}

# Domain name -> list of tables (second table, when present, references the first).
DOMAINS = {
    "employees": [
        "department | department | departments : department_id INTEGER key; dept_name TEXT "
        "[Sales,Marketing,Engineering,Finance,Support,Legal,Research] | department name; "
        "budget REAL 50000-900000; location TEXT @city",
        "employee | employee | employees : employee_id INTEGER key; name TEXT @person; "
        "department_id INTEGER fk:department; salary REAL 30000-150000; hire_date DATE 1995-2023 | "
        "hire date; age INTEGER 20-65; job_title TEXT [Manager,Analyst,Engineer,Clerk,Director] | "
        "job title",
    ],
    "flights": [
        "airport | airport | airports : airport_id INTEGER key; airport_name TEXT @title | "
        "airport name; city TEXT @city; country TEXT @country; elevation INTEGER 0-3000",
        "flight | flight | flights : flight_id INTEGER key; flight_number TEXT @code | flight number; "
        "origin_airport_id INTEGER fk:airport; departure_date DATE 2015-2024 | departure date; "
        "distance INTEGER 100-9000; price REAL 50-2000; airline TEXT "
        "[Delta,United,Lufthansa,Emirates,Qantas,Ryanair,Iberia]",
    ],
    "orders": [
        "customer | customer | customers : customer_id INTEGER key; customer_name TEXT @person | "
        "customer name; city TEXT @city; segment TEXT [Retail,Wholesale,Online,Corporate]; "
        "signup_date DATE 2010-2024 | signup date",
        "orders | order | orders : order_id INTEGER key; customer_id INTEGER fk:customer; "
        "order_date DATE 2015-2024 | order date; amount REAL 5-5000; quantity INTEGER 1-50; "
        "status TEXT [pending,shipped,delivered,cancelled,returned]",
    ],
    "music": [
        "artist | artist | artists : artist_id INTEGER key; artist_name TEXT @person | artist name; "
        "country TEXT @country; genre TEXT [rock,pop,jazz,blues,folk,metal,hip hop,classical]; "
        "debut_year INTEGER 1950-2020 | debut year",
        "song | song | songs : song_id INTEGER key; title TEXT @title; artist_id INTEGER fk:artist; "
        "duration INTEGER 90-600 | duration in seconds; release_date DATE 1960-2024 | release date; "
        "plays INTEGER 0-900000 | number of plays; rating REAL 1-10",
    ],
    "library": [
        "author | author | authors : author_id INTEGER key; author_name TEXT @person | author name; "
        "nationality TEXT @country; birth_year INTEGER 1800-1990 | birth year",
        "book | book | books : book_id INTEGER key; title TEXT @title; author_id INTEGER fk:author; "
        "pages INTEGER 50-1200 | number of pages; published DATE 1900-2024 | publication date; "
        "genre TEXT [fiction,mystery,poetry,history,science,fantasy,biography]; price REAL 3-90",
    ],
    "school": [
        "teacher | teacher | teachers : teacher_id INTEGER key; teacher_name TEXT @person | "
        "teacher name; subject TEXT [math,physics,chemistry,biology,history,art,music,english]; "
        "years_experience INTEGER 0-40 | years of experience",
        "student | student | students : student_id INTEGER key; student_name TEXT @person | "
        "student name; teacher_id INTEGER fk:teacher; grade INTEGER 1-12; gpa REAL 1-4 | GPA; "
        "enrollment_date DATE 2010-2024 | enrollment date; hometown TEXT @city",
    ],
    "hospital": [
        "physician | physician | physicians : physician_id INTEGER key; name TEXT @person; "
        "specialty TEXT [cardiology,neurology,oncology,pediatrics,surgery,radiology]; "
        "years_practice INTEGER 1-45 | years of practice",
        "patient | patient | patients : patient_id INTEGER key; patient_name TEXT @person | "
        "patient name; physician_id INTEGER fk:physician; age INTEGER 0-100; "
        "admission_date DATE 2015-2024 | admission date; room_number INTEGER 100-999 | room number; "
        "bill REAL 100-90000",
    ],
    "movies": [
        "studio | studio | studios : studio_id INTEGER key; studio_name TEXT @company | studio name; "
        "country TEXT @country; founded INTEGER 1900-2015 | founding year",
        "movie | movie | movies : movie_id INTEGER key; title TEXT @title; studio_id INTEGER fk:studio; "
        "release_year INTEGER 1930-2024 | release year; budget REAL 1-300 | budget in millions; "
        "gross REAL 1-2500 | gross in millions; rating TEXT [G,PG,PG-13,R]; runtime INTEGER 70-210",
    ],
    "sports": [
        "team | team | teams : team_id INTEGER key; team_name TEXT @word | team name; city TEXT @city; "
        "founded INTEGER 1870-2010 | founding year; stadium_capacity INTEGER 5000-99000 | "
        "stadium capacity",
        "player | player | players : player_id INTEGER key; player_name TEXT @person | player name; "
        "team_id INTEGER fk:team; position TEXT [goalkeeper,defender,midfielder,forward]; "
        "goals INTEGER 0-300; height REAL 150-210 | height in cm; birth_date DATE 1980-2006 | "
        "birth date",
    ],
    "hotels": [
        "hotel | hotel | hotels : hotel_id INTEGER key; hotel_name TEXT @title | hotel name; "
        "city TEXT @city; stars INTEGER 1-5 | star rating; rooms INTEGER 10-900 | number of rooms",
        "booking | booking | bookings : booking_id INTEGER key; hotel_id INTEGER fk:hotel; "
        "guest_name TEXT @person | guest name; check_in DATE 2018-2024 | check-in date; "
        "nights INTEGER 1-30 | number of nights; total_cost REAL 50-9000 | total cost",
    ],
    "cars": [
        "manufacturer | manufacturer | manufacturers : maker_id INTEGER key; maker_name TEXT @company | "
        "manufacturer name; country TEXT @country; founded_year INTEGER 1880-2010 | founded year",
        "car | car | cars : car_id INTEGER key; model TEXT @word; maker_id INTEGER fk:manufacturer; "
        "horsepower INTEGER 60-800; weight REAL 800-3500; mpg REAL 10-60 | miles per gallon; "
        "model_year INTEGER 1970-2024 | model year; color TEXT @color",
    ],
    "restaurants": [
        "restaurant | restaurant | restaurants : restaurant_id INTEGER key; restaurant_name TEXT "
        "@title | restaurant name; cuisine TEXT [Italian,Mexican,Thai,Indian,French,Japanese,Greek]; "
        "city TEXT @city; rating REAL 1-5; seats INTEGER 10-300 | number of seats",
        "review | review | reviews : review_id INTEGER key; restaurant_id INTEGER fk:restaurant; "
        "reviewer TEXT @person; score INTEGER 1-10; review_date DATE 2012-2024 | review date",
    ],
    "weather": [
        "station | station | stations : station_id INTEGER key; station_name TEXT @word | "
        "station name; city TEXT @city; altitude INTEGER 0-4000",
        "reading | reading | readings : reading_id INTEGER key; station_id INTEGER fk:station; "
        "reading_date DATE 2000-2024 | reading date; temperature REAL -30-45; "
        "rainfall REAL 0-300; wind_speed REAL 0-150 | wind speed; humidity INTEGER 0-100",
    ],
    "banking": [
        "branch | branch | branches : branch_id INTEGER key; branch_name TEXT @word | branch name; "
        "city TEXT @city; opened INTEGER 1950-2020 | opening year",
        "account | account | accounts : account_id INTEGER key; branch_id INTEGER fk:branch; "
        "owner_name TEXT @person | owner name; balance REAL 0-250000; account_type TEXT "
        "[checking,savings,business,student] | account type; opened_date DATE 1990-2024 | opening date",
    ],
    "products": [
        "supplier | supplier | suppliers : supplier_id INTEGER key; supplier_name TEXT @company | "
        "supplier name; country TEXT @country; rating INTEGER 1-5",
        "product | product | products : product_id INTEGER key; product_name TEXT @word | "
        "product name; supplier_id INTEGER fk:supplier; category TEXT "
        "[electronics,toys,garden,kitchen,clothing,books,sports]; unit_price REAL 1-900 | unit price; "
        "stock INTEGER 0-5000 | units in stock",
    ],
    "university": [
        "faculty | faculty | faculties : faculty_id INTEGER key; faculty_name TEXT "
        "[Science,Arts,Engineering,Medicine,Law,Business] | faculty name; dean TEXT @person; "
        "established INTEGER 1800-2000 | year established",
        "course | course | courses : course_id INTEGER key; course_title TEXT @title | course title; "
        "faculty_id INTEGER fk:faculty; credits INTEGER 1-10; enrollment INTEGER 5-500; "
        "semester TEXT [fall,spring,summer]",
    ],
    "real_estate": [
        "agent | agent | agents : agent_id INTEGER key; agent_name TEXT @person | agent name; "
        "agency TEXT @company; commission_rate REAL 1-6 | commission rate",
        "property | property | properties : property_id INTEGER key; agent_id INTEGER fk:agent; "
        "address TEXT @title; city TEXT @city; bedrooms INTEGER 1-7 | number of bedrooms; "
        "area REAL 30-600 | area in square meters; list_price REAL 50000-3000000 | list price; "
        "listed_date DATE 2015-2024 | listing date",
    ],
    "museums": [
        "museum | museum | museums : museum_id INTEGER key; museum_name TEXT @title | museum name; "
        "city TEXT @city; opening_year INTEGER 1750-2020 | opening year; visitors INTEGER "
        "1000-9000000 | annual visitors",
        "artwork | artwork | artworks : artwork_id INTEGER key; museum_id INTEGER fk:museum; "
        "title TEXT @title; artist TEXT @person; year_created INTEGER 1400-2020 | year created; "
        "medium TEXT [oil,watercolor,bronze,marble,photograph,ink]; value REAL 1-500 | "
        "value in millions",
    ],
    "games": [
        "publisher | publisher | publishers : publisher_id INTEGER key; publisher_name TEXT @company | "
        "publisher name; country TEXT @country; founded INTEGER 1970-2015 | founding year",
        "game | game | games : game_id INTEGER key; title TEXT @title; publisher_id INTEGER "
        "fk:publisher; platform TEXT [PC,PlayStation,Xbox,Switch,Mobile]; release_date DATE "
        "1985-2024 | release date; units_sold INTEGER 1000-40000000 | units sold; score REAL 1-10",
    ],
    "zoo": [
        "enclosure | enclosure | enclosures : enclosure_id INTEGER key; enclosure_name TEXT @word | "
        "enclosure name; habitat TEXT [savanna,jungle,desert,arctic,aquatic,forest]; area INTEGER "
        "100-20000 | area in square meters",
        "animal | animal | animals : animal_id INTEGER key; animal_name TEXT @first | animal name; "
        "species TEXT [lion,tiger,zebra,penguin,giraffe,elephant,otter,panda]; enclosure_id INTEGER "
        "fk:enclosure; weight REAL 1-6000 | weight in kg; birth_date DATE 1995-2024 | birth date",
    ],
    "shipping": [
        "port | port | ports : port_id INTEGER key; port_name TEXT @city | port name; country TEXT "
        "@country; berths INTEGER 2-120 | number of berths",
        "ship | ship | ships : ship_id INTEGER key; ship_name TEXT @title | ship name; home_port_id "
        "INTEGER fk:port; tonnage INTEGER 500-220000; built_year INTEGER 1950-2024 | year built; "
        "ship_type TEXT [tanker,container,bulk,cruise,ferry] | ship type; crew INTEGER 5-1500 | "
        "crew size",
    ],
    "elections": [
        "party | party | parties : party_id INTEGER key; party_name TEXT @word | party name; "
        "ideology TEXT [liberal,conservative,green,socialist,centrist]; founded INTEGER 1850-2015 | "
        "founding year",
        "candidate | candidate | candidates : candidate_id INTEGER key; candidate_name TEXT @person | "
        "candidate name; party_id INTEGER fk:party; district TEXT @city; votes INTEGER 100-900000; "
        "vote_share REAL 0-100 | vote share",
    ],
    "gym": [
        "trainer | trainer | trainers : trainer_id INTEGER key; trainer_name TEXT @person | "
        "trainer name; specialty TEXT [yoga,boxing,pilates,cycling,weights,swimming]; hourly_rate "
        "REAL 15-150 | hourly rate",
        "member | member | members : member_id INTEGER key; member_name TEXT @person | member name; "
        "trainer_id INTEGER fk:trainer; join_date DATE 2012-2024 | join date; visits INTEGER 0-500 | "
        "number of visits; plan TEXT [basic,premium,family,student]",
    ],
    "farm": [
        "farm | farm | farms : farm_id INTEGER key; farm_name TEXT @word | farm name; region TEXT "
        "@country; hectares REAL 1-5000",
        "harvest | harvest | harvests : harvest_id INTEGER key; farm_id INTEGER fk:farm; crop TEXT "
        "[wheat,corn,rice,barley,soy,potato,apple]; harvest_date DATE 2000-2024 | harvest date; "
        "tons REAL 0-9000 | tons harvested; price_per_ton REAL 50-900 | price per ton",
    ],
    "concerts": [
        "venue | venue | venues : venue_id INTEGER key; venue_name TEXT @title | venue name; "
        "city TEXT @city; capacity INTEGER 100-90000",
        "concert | concert | concerts : concert_id INTEGER key; venue_id INTEGER fk:venue; "
        "performer TEXT @person; concert_date DATE 2000-2024 | concert date; tickets_sold INTEGER "
        "50-90000 | tickets sold; ticket_price REAL 10-400 | ticket price",
    ],
    "software": [
        "repository | repository | repositories : repo_id INTEGER key; repo_name TEXT @word | "
        "repository name; language TEXT [Python,Rust,Go,Java,C,JavaScript,Haskell]; stars INTEGER "
        "0-200000; created DATE 2008-2024 | creation date",
        "issue | issue | issues : issue_id INTEGER key; repo_id INTEGER fk:repository; title TEXT "
        "@title; author TEXT @first; state TEXT [open,closed]; comments INTEGER 0-400 | "
        "number of comments; opened_date DATE 2010-2024 | opening date",
    ],
    "airlines": [
        "airline | airline | airlines : airline_id INTEGER key; airline_name TEXT @company | "
        "airline name; country TEXT @country; fleet_size INTEGER 5-900 | fleet size",
        "aircraft | aircraft | aircraft : aircraft_id INTEGER key; airline_id INTEGER fk:airline; "
        "model TEXT [A320,A350,B737,B747,B787,E190,CRJ900]; seats INTEGER 50-600 | number of seats; "
        "first_flight DATE 1990-2024 | first flight date; range_km INTEGER 1000-16000 | range in km",
    ],
    "pets": [
        "owner | owner | owners : owner_id INTEGER key; owner_name TEXT @person | owner name; "
        "city TEXT @city; phone TEXT @code | phone number",
        "pet | pet | pets : pet_id INTEGER key; pet_name TEXT @first | pet name; owner_id INTEGER "
        "fk:owner; pet_type TEXT [dog,cat,bird,rabbit,hamster,turtle] | pet type; age INTEGER 0-20; "
        "weight REAL 0-80",
    ],
    "conference": [
        "conference | conference | conferences : conference_id INTEGER key; conference_name TEXT "
        "@word | conference name; city TEXT @city; year INTEGER 1990-2024",
        "paper | paper | papers : paper_id INTEGER key; conference_id INTEGER fk:conference; title "
        "TEXT @title; first_author TEXT @person | first author; citations INTEGER 0-9000; "
        "topic TEXT [vision,language,robotics,theory,systems,security]",
    ],
    "police": [
        "precinct | precinct | precincts : precinct_id INTEGER key; precinct_name TEXT @word | "
        "precinct name; city TEXT @city; officers INTEGER 10-900 | number of officers",
        "incident | incident | incidents : incident_id INTEGER key; precinct_id INTEGER fk:precinct; "
        "incident_type TEXT [theft,fraud,vandalism,burglary,assault] | incident type; incident_date "
        "DATE 2005-2024 | incident date; damage REAL 0-100000 | damage amount",
    ],
    "energy": [
        "power_plant | power plant | power plants : plant_id INTEGER key; plant_name TEXT @word | "
        "plant name; fuel TEXT [coal,gas,nuclear,hydro,solar,wind]; country TEXT @country; "
        "capacity_mw REAL 5-5000 | capacity in megawatts",
        "outage | outage | outages : outage_id INTEGER key; plant_id INTEGER fk:power_plant; "
        "start_date DATE 2000-2024 | start date; duration_hours INTEGER 1-800 | duration in hours; "
        "cause TEXT [maintenance,storm,failure,fire,strike]",
    ],
    "tv": [
        "channel | channel | channels : channel_id INTEGER key; channel_name TEXT @word | "
        "channel name; country TEXT @country; launched INTEGER 1940-2020 | launch year",
        "show | show | shows : show_id INTEGER key; title TEXT @title; channel_id INTEGER fk:channel; "
        "seasons INTEGER 1-30 | number of seasons; viewers REAL 0-40 | viewers in millions; "
        "premiere DATE 1960-2024 | premiere date; genre TEXT [drama,comedy,news,reality,documentary]",
    ],
    "courses_online": [
        "instructor | instructor | instructors : instructor_id INTEGER key; instructor_name TEXT "
        "@person | instructor name; country TEXT @country; rating REAL 1-5",
        "lesson | lesson | lessons : lesson_id INTEGER key; instructor_id INTEGER fk:instructor; "
        "lesson_title TEXT @title | lesson title; minutes INTEGER 5-180 | length in minutes; "
        "views INTEGER 0-900000 | number of views; level TEXT [beginner,intermediate,advanced]",
    ],
    "bakery": [
        "bakery | bakery | bakeries : bakery_id INTEGER key; bakery_name TEXT @title | bakery name; "
        "city TEXT @city; employees INTEGER 1-80 | number of employees",
        "pastry | pastry | pastries : pastry_id INTEGER key; bakery_id INTEGER fk:bakery; "
        "pastry_name TEXT [croissant,muffin,eclair,scone,bagel,donut,strudel] | pastry name; "
        "price REAL 1-15; calories INTEGER 100-900; baked_date DATE 2022-2024 | baking date",
    ],
    "rail": [
        "station | station | stations : station_id INTEGER key; station_name TEXT @city | "
        "station name; platforms INTEGER 1-40 | number of platforms; opened INTEGER 1830-2020 | "
        "opening year",
        "train | train | trains : train_id INTEGER key; train_number TEXT @code | train number; "
        "station_id INTEGER fk:station; train_type TEXT [express,regional,freight,sleeper] | "
        "train type; speed INTEGER 60-350 | top speed; cars INTEGER 2-20 | number of cars",
    ],
    "charity": [
        "charity | charity | charities : charity_id INTEGER key; charity_name TEXT @word | "
        "charity name; cause TEXT [health,education,environment,animals,poverty]; founded INTEGER "
        "1900-2020 | founding year",
        "donation | donation | donations : donation_id INTEGER key; charity_id INTEGER fk:charity; "
        "donor TEXT @person; amount REAL 5-100000; donation_date DATE 2005-2024 | donation date",
    ],
    "parking": [
        "garage | garage | garages : garage_id INTEGER key; garage_name TEXT @word | garage name; "
        "city TEXT @city; spaces INTEGER 20-3000 | number of spaces; hourly_fee REAL 1-20 | "
        "hourly fee",
        "ticket | ticket | tickets : ticket_id INTEGER key; garage_id INTEGER fk:garage; plate TEXT "
        "@code | license plate; entry_date DATE 2020-2024 | entry date; hours INTEGER 1-72; "
        "fee REAL 1-300",
    ],
    "mountains": [
        "range | mountain range | mountain ranges : range_id INTEGER key; range_name TEXT @word | "
        "range name; country TEXT @country; length_km INTEGER 50-7000 | length in km",
        "mountain | mountain | mountains : mountain_id INTEGER key; mountain_name TEXT @title | "
        "mountain name; range_id INTEGER fk:range; height INTEGER 500-8848 | height in meters; "
        "prominence INTEGER 100-8848; first_ascent INTEGER 1780-2020 | year of first ascent",
    ],
    "insurance": [
        "policy_holder | policy holder | policy holders : holder_id INTEGER key; holder_name TEXT "
        "@person | holder name; city TEXT @city; age INTEGER 18-90",
        "claim | claim | claims : claim_id INTEGER key; holder_id INTEGER fk:policy_holder; "
        "claim_type TEXT [auto,home,health,travel,life] | claim type; amount_claimed REAL 100-500000 "
        "| amount claimed; claim_date DATE 2010-2024 | claim date; approved TEXT [yes,no]",
    ],
    "festival": [
        "festival | festival | festivals : festival_id INTEGER key; festival_name TEXT @title | "
        "festival name; city TEXT @city; first_year INTEGER 1950-2020 | first year",
        "performance | performance | performances : performance_id INTEGER key; festival_id "
        "INTEGER fk:festival; act TEXT @person; stage TEXT [main,north,south,tent,acoustic]; "
        "audience INTEGER 50-120000 | audience size; performance_date DATE 2010-2024 | "
        "performance date",
    ],
    "telecom": [
        "plan | plan | plans : plan_id INTEGER key; plan_name TEXT @word | plan name; monthly_fee "
        "REAL 5-150 | monthly fee; data_gb INTEGER 1-500 | data allowance in GB",
        "subscriber | subscriber | subscribers : subscriber_id INTEGER key; subscriber_name TEXT "
        "@person | subscriber name; plan_id INTEGER fk:plan; city TEXT @city; minutes_used INTEGER "
        "0-9000 | minutes used; start_date DATE 2010-2024 | start date",
    ],
    "astronomy": [
        "star | star | stars : star_id INTEGER key; star_name TEXT @word | star name; "
        "spectral_class TEXT [O,B,A,F,G,K,M] | spectral class; distance_ly REAL 4-9000 | "
        "distance in light years",
        "planet | planet | planets : planet_id INTEGER key; planet_name TEXT @code | planet name; "
        "star_id INTEGER fk:star; mass REAL 0-4000 | mass in earth masses; orbital_period REAL "
        "0-9000 | orbital period in days; discovered INTEGER 1990-2024 | discovery year",
    ],
    "wine": [
        "winery | winery | wineries : winery_id INTEGER key; winery_name TEXT @title | winery name; "
        "country TEXT @country; hectares INTEGER 1-900",
        "wine | wine | wines : wine_id INTEGER key; winery_id INTEGER fk:winery; wine_name TEXT "
        "@word | wine name; grape TEXT [merlot,syrah,riesling,malbec,chardonnay,pinot noir]; "
        "vintage INTEGER 1960-2023; score INTEGER 70-100; price REAL 5-900",
    ],
    "courts": [
        "court | court | courts : court_id INTEGER key; court_name TEXT @city | court name; level "
        "TEXT [district,appeals,supreme,county]; judges INTEGER 1-60 | number of judges",
        "case_file | case | cases : case_id INTEGER key; court_id INTEGER fk:court; plaintiff TEXT "
        "@person; defendant TEXT @company; filed_date DATE 1990-2024 | filing date; "
        "damages REAL 0-9000000 | damages sought; outcome TEXT [won,lost,settled,pending]",
    ],
    "volcanoes": [
        "volcano | volcano | volcanoes : volcano_id INTEGER key; volcano_name TEXT @word | "
        "volcano name; country TEXT @country; elevation INTEGER 100-6900; volcano_type TEXT "
        "[shield,stratovolcano,caldera,cinder cone] | volcano type",
        "eruption | eruption | eruptions : eruption_id INTEGER key; volcano_id INTEGER fk:volcano; "
        "eruption_year INTEGER 1500-2024 | eruption year; vei INTEGER 0-7 | explosivity index; "
        "deaths INTEGER 0-90000 | number of deaths",
    ],
    "cinema": [
        "cinema | cinema | cinemas : cinema_id INTEGER key; cinema_name TEXT @title | cinema name; "
        "city TEXT @city; screens INTEGER 1-30 | number of screens",
        "screening | screening | screenings : screening_id INTEGER key; cinema_id INTEGER "
        "fk:cinema; film TEXT @title; show_date DATE 2020-2024 | show date; attendance INTEGER "
        "0-800; ticket_price REAL 3-30 | ticket price",
    ],
    "marathon": [
        "race | race | races : race_id INTEGER key; race_name TEXT @city | race name; race_date "
        "DATE 1990-2024 | race date; distance_km REAL 5-100 | distance in km",
        "runner | runner | runners : runner_id INTEGER key; runner_name TEXT @person | runner name; "
        "race_id INTEGER fk:race; nationality TEXT @country; finish_minutes INTEGER 120-600 | "
        "finish time in minutes; bib_number INTEGER 1-50000 | bib number",
    ],
    "pharmacy": [
        "drug | drug | drugs : drug_id INTEGER key; drug_name TEXT @word | drug name; manufacturer "
        "TEXT @company; dosage_mg INTEGER 1-1000 | dosage in mg; price REAL 1-900",
        "prescription | prescription | prescriptions : prescription_id INTEGER key; drug_id INTEGER "
        "fk:drug; patient TEXT @person; doctor TEXT @person; issued DATE 2015-2024 | issue date; "
        "refills INTEGER 0-12 | number of refills",
    ],
    "rockets": [
        "agency | space agency | space agencies : agency_id INTEGER key; agency_name TEXT "
        "[NASA,ESA,JAXA,ISRO,CNSA,Roscosmos] | agency name; country TEXT @country; budget REAL "
        "1-30 | budget in billions",
        "launch | launch | launches : launch_id INTEGER key; agency_id INTEGER fk:agency; mission "
        "TEXT @word; launch_date DATE 1960-2024 | launch date; payload_kg INTEGER 10-60000 | "
        "payload mass in kg; outcome TEXT [success,failure,partial]",
    ],
    "bikes": [
        "dock | dock | docks : dock_id INTEGER key; dock_name TEXT @title | dock name; city TEXT "
        "@city; slots INTEGER 5-60 | number of slots",
        "trip | trip | trips : trip_id INTEGER key; start_dock_id INTEGER fk:dock; rider TEXT "
        "@first; trip_date DATE 2018-2024 | trip date; duration_min INTEGER 1-300 | duration in "
        "minutes; distance_km REAL 0-60 | distance in km; bike_type TEXT [classic,electric,cargo] | "
        "bike type",
    ],
    "recipes": [
        "chef | chef | chefs : chef_id INTEGER key; chef_name TEXT @person | chef name; country TEXT "
        "@country; michelin_stars INTEGER 0-3 | Michelin stars",
        "recipe | recipe | recipes : recipe_id INTEGER key; chef_id INTEGER fk:chef; recipe_name TEXT "
        "@title | recipe name; prep_minutes INTEGER 5-300 | preparation time; servings INTEGER 1-12; "
        "course TEXT [starter,main,dessert,side,soup]; calories INTEGER 50-2000",
    ],
    "warehouse": [
        "warehouse | warehouse | warehouses : warehouse_id INTEGER key; warehouse_code TEXT @code | "
        "warehouse code; city TEXT @city; capacity INTEGER 100-90000",
        "shipment | shipment | shipments : shipment_id INTEGER key; warehouse_id INTEGER "
        "fk:warehouse; carrier TEXT [DHL,FedEx,UPS,Maersk,USPS]; ship_date DATE 2018-2024 | "
        "ship date; weight_kg REAL 1-30000 | weight in kg; cost REAL 5-20000",
    ],
    "podcasts": [
        "podcast | podcast | podcasts : podcast_id INTEGER key; podcast_name TEXT @title | "
        "podcast name; host TEXT @person; category TEXT [news,comedy,science,sports,history,crime]",
        "episode | episode | episodes : episode_id INTEGER key; podcast_id INTEGER fk:podcast; "
        "episode_title TEXT @title | episode title; length_minutes INTEGER 5-240 | length in "
        "minutes; downloads INTEGER 0-5000000; air_date DATE 2010-2024 | air date",
    ],
    "clinics": [
        "clinic | clinic | clinics : clinic_id INTEGER key; clinic_name TEXT @word | clinic name; "
        "city TEXT @city; beds INTEGER 0-400 | number of beds",
        "appointment | appointment | appointments : appointment_id INTEGER key; clinic_id INTEGER "
        "fk:clinic; patient_name TEXT @person | patient name; appointment_date DATE 2019-2024 | "
        "appointment date; fee REAL 10-900; department TEXT [dental,eye,skin,general,ortho]",
    ],
    "tournament": [
        "club | club | clubs : club_id INTEGER key; club_name TEXT @word | club name; country TEXT "
        "@country; members INTEGER 10-5000 | number of members",
        "chess_player | chess player | chess players : player_id INTEGER key; player_name TEXT "
        "@person | player name; club_id INTEGER fk:club; elo INTEGER 1000-2850 | Elo rating; "
        "title TEXT [GM,IM,FM,CM,none]; wins INTEGER 0-900 | number of wins",
    ],
    "ecommerce": [
        "seller | seller | sellers : seller_id INTEGER key; seller_name TEXT @company | seller name; "
        "country TEXT @country; join_date DATE 2005-2024 | join date",
        "listing | listing | listings : listing_id INTEGER key; seller_id INTEGER fk:seller; "
        "item TEXT @word; price REAL 1-5000; views INTEGER 0-900000; condition TEXT "
        "[new,used,refurbished]; posted DATE 2015-2024 | posting date",
    ],
    "satellites": [
        "operator | operator | operators : operator_id INTEGER key; operator_name TEXT @company | "
        "operator name; country TEXT @country",
        "satellite | satellite | satellites : satellite_id INTEGER key; operator_id INTEGER "
        "fk:operator; satellite_name TEXT @code | satellite name; orbit TEXT [LEO,MEO,GEO,HEO]; "
        "launch_year INTEGER 1960-2024 | launch year; mass_kg INTEGER 1-20000 | mass in kg; "
        "power_kw REAL 0-30 | power in kW",
    ],
    "voting_polls": [
        "pollster | pollster | pollsters : pollster_id INTEGER key; pollster_name TEXT @company | "
        "pollster name; grade TEXT [A,B,C,D]",
        "poll | poll | polls : poll_id INTEGER key; pollster_id INTEGER fk:pollster; state TEXT @city "
        "| region; poll_date DATE 2000-2024 | poll date; sample_size INTEGER 100-9000 | sample size; "
        "margin REAL 0-30 | margin of error",
    ],
    "fisheries": [
        "vessel | vessel | vessels : vessel_id INTEGER key; vessel_name TEXT @title | vessel name; "
        "flag TEXT @country | flag country; length_m REAL 5-120 | length in meters",
        "catch_record | catch | catches : catch_id INTEGER key; vessel_id INTEGER fk:vessel; fish "
        "TEXT [cod,tuna,salmon,herring,mackerel,sardine]; catch_date DATE 2000-2024 | catch date; "
        "tonnes REAL 0-900 | tonnes caught",
    ],
    "theatre": [
        "theatre | theatre | theatres : theatre_id INTEGER key; theatre_name TEXT @title | theatre "
        "name; city TEXT @city; seats INTEGER 50-3000 | number of seats",
        "play | play | plays : play_id INTEGER key; theatre_id INTEGER fk:theatre; play_title TEXT "
        "@title | play title; playwright TEXT @person; opening_night DATE 1950-2024 | opening night; "
        "performances INTEGER 1-9000 | number of performances",
    ],
}

# --------------------------------------------------------------------------------------------
# Entity nouns ("singular/plural"), one of the kinds of word pieces that scripts/sqlgen.py
# composes table and column names of the train split from.
# --------------------------------------------------------------------------------------------
PROC_ENTITIES = (
    "widget/widgets gadget/gadgets sensor/sensors vendor/vendors ticket/tickets planet/planets "
    "river/rivers lake/lakes island/islands bridge/bridges tower/towers castle/castles village/villages "
    "road/roads tree/trees flower/flowers bird/birds insect/insects robot/robots drone/drones "
    "camera/cameras laptop/laptops phone/phones router/routers server/servers device/devices "
    "user/users account_holder/account_holders editor/editors reporter/reporters article/articles "
    "magazine/magazines newspaper/newspapers journal/journals volunteer/volunteers event/events "
    "workshop/workshops seminar/seminars lecture/lectures exam/exams school_class/school_classes "
    "club_member/club_members athlete/athletes coach/coaches referee/referees match/matches "
    "league/leagues stadium/stadiums arena/arenas gallery/galleries painting/paintings "
    "sculpture/sculptures exhibit/exhibits vehicle/vehicles truck/trucks bus/buses driver/drivers "
    "route/routes stop/stops garage_lot/garage_lots toy/toys puzzle/puzzles candy/candies "
    "fruit/fruits vegetable/vegetables dish/dishes menu/menus ingredient/ingredients "
    "customer_order/customer_orders invoice/invoices payment/payments refund/refunds "
    "subscription/subscriptions license/licenses contract/contracts project/projects task/tasks "
    "milestone/milestones bug/bugs release/releases package/packages module/modules "
    "library_branch/library_branches shelf/shelves room/rooms building/buildings apartment/apartments "
    "tenant/tenants landlord/landlords neighborhood/neighborhoods district/districts county/counties "
    "province/provinces region_office/region_offices office/offices desk/desks employee_badge/"
    "employee_badges shift/shifts nurse/nurses surgeon/surgeons ward/wards medicine/medicines "
    "vaccine/vaccines trial/trials lab/labs experiment/experiments sample/samples specimen/specimens "
    "telescope/telescopes galaxy/galaxies comet/comets moon/moons spacecraft/spacecraft "
    "mission/missions astronaut/astronauts pilot/pilots airport_gate/airport_gates runway/runways "
    "cargo/cargos container/containers crate/crates pallet/pallets store/stores shop/shops "
    "mall/malls brand/brands dealer/dealers auction/auctions bid/bids lot/lots coin/coins "
    "stamp/stamps collector/collectors album/albums track/tracks band/bands musician/musicians "
    "instrument/instruments orchestra/orchestras choir/choirs singer/singers dancer/dancers "
    "studio_room/studio_rooms recording/recordings playlist/playlists channel_member/channel_members "
    "forum/forums post/posts comment/comments message/messages inbox/inboxes folder/folders "
    "file_record/file_records document/documents report/reports survey/surveys response/responses "
    "question/questions answer/answers quiz/quizzes badge/badges award/awards prize/prizes "
    "competition/competitions contestant/contestants judge/judges jury/juries trophy/trophies "
    "garden/gardens plant/plants seed/seeds greenhouse/greenhouses orchard/orchards beehive/beehives "
    "horse/horses stable/stables kennel/kennels shelter/shelters adopter/adopters donor/donors "
    "sponsor/sponsors grant/grants scholarship/scholarships applicant/applicants candidate_pool/"
    "candidate_pools interview/interviews recruiter/recruiters intern/interns mentor/mentors"
).split()
